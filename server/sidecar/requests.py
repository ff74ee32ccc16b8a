"""What ``POST /api/runs`` accepts (docs/sidecar.md, docs/limits.md): the body validated into a typed request.

API validation, not the slot rule: every field is checked here with a 400 that names it and says what
to fix, and an option that is not built yet is refused by name rather than accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...common.errors import RequestError
from ...constants import (
    LOCAL_PROVIDER,
    MAX_DEVICE_SET,
    MAX_FIELD_NAME_CHARS,
    MAX_GRAPH_NODES,
    MAX_GRAPH_STRING_CHARS,
    MAX_NODE_ID_CHARS,
    MAX_RUN_NAME_CHARS,
    WORKER_NAME_RE,
)
from ...nodes import mounts
from ..devices.names import device_kind, normalize_device
from ..scheduling.routing import MEMORY_SOURCES, RunTarget, TargetError

LOCAL = LOCAL_PROVIDER


# --- the request (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRequest:
    """A validated ``POST /api/runs`` body."""

    graph: dict[str, Any]
    options: dict[str, Any]
    target: RunTarget
    name: str | None = None
    seed: int | None = None


OPTION_FIELDS = ("name", "seed", "deterministic", "record_outputs", "device", "target")
RECORD_MODES = ("upload",)  # record_outputs: true / false / "upload" (docs/workers.md; upload: beyond the seed)


def parse_run_request(body: Any) -> RunRequest:
    """Validate ``{"graph": {...}, "options": {...}}``; raise RequestError naming the field to fix."""
    if not isinstance(body, Mapping):
        raise RequestError("the body must be a JSON object {\"graph\": {...}, \"options\": {...}}")
    unknown = sorted(set(body) - {"graph", "options"})
    if unknown:
        raise RequestError(f"unknown field(s) {', '.join(unknown)}: the body has \"graph\" and \"options\"")
    if "graph" not in body:
        raise RequestError("graph: missing; send the graph in ComfyUI's API format as \"graph\"")
    graph = body["graph"]
    check_graph_shape(graph)
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise RequestError("options: must be an object")
    unknown = sorted(set(options) - set(OPTION_FIELDS))
    if unknown:
        raise RequestError(f"options: unknown field(s) {', '.join(unknown)}; known: {', '.join(OPTION_FIELDS)}")
    name = options.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise RequestError("options.name: must be a string")
        name = name.strip()
        if len(name) > MAX_RUN_NAME_CHARS:
            raise RequestError(f"options.name: {len(name)} characters; at most {MAX_RUN_NAME_CHARS}")
        name = name or None
    seed = options.get("seed")
    if seed is not None:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**63:
            raise RequestError("options.seed: must be an integer between 0 and 2^63-1")
    if options.get("deterministic") is not None and not isinstance(options["deterministic"], bool):
        raise RequestError("options.deterministic: must be true or false")
    record = options.get("record_outputs")
    if record is not None and not isinstance(record, bool) and record not in RECORD_MODES:
        raise RequestError("options.record_outputs: must be true (kept on the worker), \"upload\" (also copied "
                           "to this server when the run ends) or false")
    try:
        target = parse_target(options)
    except TargetError as exc:
        raise RequestError(str(exc)) from None
    if record and target.pool is not None:
        raise RequestError("options.record_outputs is off for a one-shot pool (options.target.pool): its agent "
                           "exits when the run ends, so nothing could read the outputs it keeps; leave it out")
    labels = mounts.labels_in_graph(graph)
    if labels:
        target = dataclasses.replace(target, mounts=tuple(labels))
    clean = {k: v for k, v in options.items() if v is not None}
    if name is not None:
        clean["name"] = name
    graph_clean = {str(k): dict(v) for k, v in graph.items()}
    return RunRequest(graph=graph_clean, options=clean, target=target, name=name, seed=seed)


_INF = float("inf")


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_graph_shape(graph: Any) -> None:
    """The graph's size and shape within the limits (constants.py), before any validation: at most
    ``MAX_GRAPH_NODES`` nodes (413 beyond), ids, class types and input names within their lengths,
    no string value longer than ``MAX_GRAPH_STRING_CHARS``. One pass over the graph, no recursion."""
    if not isinstance(graph, Mapping) or not graph:
        raise RequestError("graph: must be a non-empty object {\"<node id>\": {\"class_type\", \"inputs\"}}")
    if len(graph) > MAX_GRAPH_NODES:
        raise RequestError(f"graph: {len(graph)} nodes; a graph has at most {MAX_GRAPH_NODES} (the limit)",
                           status=413)
    for nid, node in graph.items():
        if len(nid) > MAX_NODE_ID_CHARS:
            raise RequestError(f"graph: node id {_short(nid)} has {len(nid)} characters; at most {MAX_NODE_ID_CHARS}")
        if not isinstance(node, Mapping):
            raise RequestError(f"graph[{nid!r}]: a node must be an object with class_type and inputs")
        for key in node:
            if len(key) > MAX_FIELD_NAME_CHARS:
                raise RequestError(f"graph[{nid!r}]: a field name of {len(key)} characters; at most "
                                   f"{MAX_FIELD_NAME_CHARS}")
        ct = node.get("class_type")
        if not isinstance(ct, str) or not ct:
            raise RequestError(f"graph[{nid!r}].class_type: missing or not a string")
        if len(ct) > MAX_FIELD_NAME_CHARS:
            raise RequestError(f"graph[{nid!r}].class_type: {len(ct)} characters; at most {MAX_FIELD_NAME_CHARS}")
        inputs = node.get("inputs", {})
        if not isinstance(inputs, Mapping):
            raise RequestError(f"graph[{nid!r}].inputs: must be an object")
        for name, value in inputs.items():
            if len(name) > MAX_FIELD_NAME_CHARS:
                raise RequestError(f"graph[{nid!r}].inputs: an input name of {len(name)} characters "
                                   f"({_short(name)}); at most {MAX_FIELD_NAME_CHARS}")
            kind = type(value)
            if kind is str:  # (most inputs: a literal, checked without the walk below)
                if len(value) <= MAX_GRAPH_STRING_CHARS:
                    continue
            elif kind is int or kind is bool or value is None:
                continue
            elif kind is float:
                if value == value and value not in (_INF, -_INF):
                    continue
            elif (kind is list and len(value) == 2 and type(value[0]) is str and type(value[1]) is int
                  and len(value[0]) <= MAX_GRAPH_STRING_CHARS):
                continue  # a link [node id, output index]: most of a large graph's non-literal inputs
            stack = [value]
            while stack:  # nested lists/objects of one input (their depth is bounded by the body's)
                item = stack.pop()
                if isinstance(item, str):
                    if len(item) > MAX_GRAPH_STRING_CHARS:
                        raise RequestError(f"graph[{nid!r}].inputs.{name}: a string of {len(item)} characters; "
                                           f"at most {MAX_GRAPH_STRING_CHARS}")
                elif isinstance(item, (list, tuple)):
                    stack.extend(item)
                elif isinstance(item, float):
                    if item != item or item in (_INF, -_INF):
                        raise RequestError(f"graph[{nid!r}].inputs.{name}: holds NaN or Infinity, which JSON "
                                           f"does not allow")
                elif isinstance(item, Mapping):
                    stack.extend(item.values())
                    stack.extend(item.keys())


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
    known = {"worker", "devices", "memory_gib", "memory_source", "wait", "pool", "spread"}
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
