"""What ``options.target`` and ``options.device`` of ``POST /api/runs`` accept (docs/sidecar.md): the
cross-field rules of the target (worker or pool, a device set, a budget, a spread over workers), each
refused with a :class:`TargetError` naming the field. The :class:`~.runs.Target` model describes the same
fields; its field names are the ``known`` list here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...constants import LOCAL_PROVIDER, MAX_DEVICE_SET, WORKER_NAME_RE
from ..devices.names import device_kind, normalize_device
from ..scheduling.routing import MEMORY_SOURCES, RunTarget, TargetError

LOCAL = LOCAL_PROVIDER
TARGET_FIELDS = ("worker", "devices", "memory_gib", "memory_source", "wait", "pool", "spread")


def parse_target(options: Mapping[str, Any]) -> RunTarget:
    """Validate ``options.target`` and ``options.device``; raise TargetError naming the field.

    ``target`` may be a string (``"local"``, ``"any"``, a worker name) or an object
    ``{"worker", "devices", "memory_gib", "memory_source", "wait", "pool"}``.
    """
    raw = options.get("target")
    device_raw = options.get("device")
    if raw is None:
        raw = {}
    if isinstance(raw, str):
        raw = {"worker": raw}
    if not isinstance(raw, Mapping):
        raise TargetError("options.target must be an object like {\"worker\": \"local\"} or a worker name string")
    known = set(TARGET_FIELDS)
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TargetError(f"options.target has unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    if raw.get("spread") is not None:
        spread = parse_spread(raw, device_raw)
        memory_gib, memory_source, wait = parse_memory(raw)
        return RunTarget(worker="spread", memory_gib=memory_gib, memory_source=memory_source, wait=wait,
                         spread=spread)
    worker = raw.get("worker", LOCAL)
    if worker is None:
        worker = LOCAL
    if not isinstance(worker, str) or not worker.strip():
        raise TargetError("options.target.worker must be \"local\", \"any\" or a worker name")
    worker = worker.strip()
    if worker not in (LOCAL, "any") and not WORKER_NAME_RE.match(worker):
        raise TargetError(
            f"options.target.worker {worker!r} is not a worker name (letters, digits, '.', '_', '-'; up to 64)"
        )
    pool = raw.get("pool")
    if pool is not None:
        if not isinstance(pool, str) or not WORKER_NAME_RE.match(pool.strip()):
            raise TargetError("options.target.pool must be a pool name (letters, digits, '.', '_', '-')")
        pool = pool.strip()
        if worker not in (LOCAL, "any"):
            raise TargetError("give options.target.worker or options.target.pool, not both")
    devices: tuple[str, ...] | None = None
    if raw.get("devices") is not None:
        devices = parse_devices(raw["devices"], "options.target.devices")
    device: str | None = None
    if device_raw is not None:
        try:
            device = normalize_device(device_raw, allow_kind=True, allow_auto=True)
        except ValueError as exc:
            raise TargetError(f"options.device: {exc}") from None
        if devices is not None:
            if device != devices[0]:
                raise TargetError(
                    "give options.device or options.target.devices, not both "
                    f"(device {device} is not the first device of the set {', '.join(devices)})"
                )
            device = None
    memory_gib, memory_source, wait = parse_memory(raw)
    return RunTarget(worker, devices, device, pool, memory_gib, memory_source, wait)


def parse_memory(raw: Mapping[str, Any]) -> tuple[float | None, str | None, bool | None]:
    """``memory_gib``, ``memory_source`` and ``wait`` of ``options.target`` (a one-worker target's or a
    spread target's: the budget is per card, on every card of the run)."""
    memory_gib = raw.get("memory_gib")
    if memory_gib is not None:
        if isinstance(memory_gib, bool) or not isinstance(memory_gib, int | float) or not memory_gib > 0 \
                or memory_gib != memory_gib or memory_gib > 1e6:
            raise TargetError("options.target.memory_gib must be a positive number of GiB per card, e.g. 6")
        memory_gib = float(memory_gib)
    memory_source = raw.get("memory_source")
    if memory_source is not None and memory_source not in MEMORY_SOURCES:
        raise TargetError(f"options.target.memory_source must be one of {', '.join(MEMORY_SOURCES)}")
    if memory_source is not None and memory_gib is None:
        raise TargetError("options.target.memory_source needs options.target.memory_gib")
    wait = raw.get("wait")
    if wait is not None and not isinstance(wait, bool):
        raise TargetError("options.target.wait must be true or false")
    return memory_gib, memory_source, wait


def parse_devices(devs: Any, path: str) -> tuple[str, ...]:
    """A device set at ``path`` (``options.target.devices``, ``options.target.spread[1].devices``):
    a non-empty list (or comma-separated string) of distinct device names of one kind."""
    if isinstance(devs, str):
        devs = [d for d in devs.split(",") if d.strip()]
    if not isinstance(devs, list) or not devs:
        raise TargetError(f"{path} must be a non-empty list of device names like [\"cuda:0\"]")
    if len(devs) > MAX_DEVICE_SET:
        raise TargetError(f"{path} lists {len(devs)} devices; at most {MAX_DEVICE_SET}")
    names: list[str] = []
    for d in devs:
        try:
            names.append(normalize_device(d, allow_kind=False))
        except ValueError as exc:
            raise TargetError(f"{path}: {exc}") from None
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise TargetError(f"{path} lists {', '.join(dupes)} more than once")
    kinds = {device_kind(n) for n in names}
    if len(kinds) > 1:
        raise TargetError(f"{path} mixes device kinds ({', '.join(names)}); a set is of one kind")
    return tuple(names)


SPREAD_ENTRY_FIELDS = ("worker", "devices")
SPREAD_TARGET_FIELDS = ("spread", "memory_gib", "memory_source", "wait")  # what may go with a spread target
DDP_KINDS = ("cuda", "xpu")  # the card kinds ddp trains on (nodes/ddp.py backend_for)


def parse_spread(raw: Mapping[str, Any], device_raw: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """``options.target.spread``: a ddp run over several workers (docs/architecture.md "ddp across
    workers"), ``[{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": [...]}]``; each
    entry is checked like a one-worker target, its errors prefixed by its path. Ranks are numbered
    across the entries in order."""
    others = sorted(k for k in raw if k not in SPREAD_TARGET_FIELDS and raw[k] is not None)
    if others or device_raw is not None:
        named = [f"options.target.{k}" for k in others] + (["options.device"] if device_raw is not None else [])
        raise TargetError(f"give options.target.spread without {', '.join(named)}: each entry names its worker "
                          f"and devices (only memory_gib, memory_source and wait go with it)")
    entries = raw["spread"]
    if not isinstance(entries, list) or len(entries) < 2:
        raise TargetError("options.target.spread must list two or more entries like {\"worker\": \"a\", "
                          "\"devices\": [\"cuda:0\"]}; for one worker use options.target.worker and devices")
    if len(entries) > MAX_DEVICE_SET:
        raise TargetError(f"options.target.spread lists {len(entries)} workers; at most {MAX_DEVICE_SET}")
    parts: list[tuple[str, tuple[str, ...]]] = []
    for i, entry in enumerate(entries):
        path = f"options.target.spread[{i}]"
        if not isinstance(entry, Mapping):
            raise TargetError(f"{path} must be an object like {{\"worker\": \"a\", \"devices\": [\"cuda:0\"]}}")
        unknown = sorted(set(entry) - set(SPREAD_ENTRY_FIELDS))
        if unknown:
            raise TargetError(f"{path} has unknown field(s) {', '.join(unknown)}; known: worker, devices")
        worker = entry.get("worker")
        if not isinstance(worker, str) or not worker.strip():
            raise TargetError(f"{path}.worker must be a worker name")
        worker = worker.strip()
        if worker in (LOCAL, "any"):
            raise TargetError(f"{path}.worker must name a worker: a spread run runs on worker agents only, not on "
                              f"{worker!r}")
        if not WORKER_NAME_RE.match(worker):
            raise TargetError(f"{path}.worker {worker!r} is not a worker name (letters, digits, '.', '_', '-'; "
                              f"up to 64)")
        if entry.get("devices") is None:
            raise TargetError(f"{path}.devices: missing; list the worker's cards, e.g. [\"cuda:0\"]")
        devices = parse_devices(entry["devices"], f"{path}.devices")
        if any(device_kind(d) not in DDP_KINDS for d in devices):
            raise TargetError(f"{path}.devices: {', '.join(devices)}; a spread run trains with ddp, one rank per "
                              f"card, on CUDA or XPU cards only")
        if parts and device_kind(devices[0]) != device_kind(parts[0][1][0]):
            raise TargetError(f"{path}.devices are {device_kind(devices[0])} cards, options.target.spread[0]'s "
                              f"are {device_kind(parts[0][1][0])}; every rank of a run uses one kind")
        if any(worker == w for w, _ in parts):
            raise TargetError(f"{path}.worker {worker!r} is listed twice; give one entry per worker with all its "
                              f"cards")
        parts.append((worker, devices))
    return tuple(parts)
