"""Slot limits (docs/sidecar.md): accelerator 1, CPU 2, and ``XPUFLEET_RUN_QUEUE_MAX_CONCURRENT`` overrides."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ...constants import ACCELERATOR_SLOT_LIMIT, CPU_SLOT_LIMIT, LOCAL_PROVIDER, WORKER_NAME_RE
from ..devices.names import normalize_device
from .offers import DeviceOffer, ProviderInfo

LOCAL = LOCAL_PROVIDER

def default_limit(kind: str) -> int:
    """Runs one slot holds when nothing overrides it: accelerator 1, CPU 2 (docs/sidecar.md)."""
    return CPU_SLOT_LIMIT if kind == "cpu" else ACCELERATOR_SLOT_LIMIT



# --- limits ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitOverrides:
    """Parsed ``XPUFLEET_RUN_QUEUE_MAX_CONCURRENT``: this server's devices and workers' devices."""

    local: Mapping[str, int] = field(default_factory=dict)
    workers: Mapping[tuple[str, str], int] = field(default_factory=dict)


def parse_limits(text: str | None) -> tuple[LimitOverrides, list[str]]:
    """Parse ``"cuda:0=2,gpu-box/cuda:1=3"``; return the overrides and one warning per skipped entry.

    A malformed entry (no ``=``, a limit that is not an integer >= 1, an unknown device, a bare kind,
    a bad worker name) is skipped; the caller logs the warnings. Empty entries are ignored.
    """
    local: dict[str, int] = {}
    workers: dict[tuple[str, str], int] = {}
    warnings: list[str] = []
    for raw in (text or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        where, sep, value = entry.partition("=")
        if not sep:
            warnings.append(f"skipped {entry!r}: write DEVICE=N or WORKER/DEVICE=N, e.g. cuda:0=2")
            continue
        try:
            limit = int(value.strip())
        except ValueError:
            warnings.append(f"skipped {entry!r}: the limit {value.strip()!r} is not an integer")
            continue
        if limit < 1:
            warnings.append(f"skipped {entry!r}: the limit must be at least 1")
            continue
        worker, slash, device = where.strip().rpartition("/")
        if slash and not WORKER_NAME_RE.match(worker.strip()):
            warnings.append(f"skipped {entry!r}: {worker.strip()!r} is not a worker name")
            continue
        try:
            dev = normalize_device(device.strip(), allow_kind=False)
        except ValueError as exc:
            warnings.append(f"skipped {entry!r}: {exc}")
            continue
        worker = worker.strip()
        if not slash or worker == LOCAL:
            key_desc = dev
            if dev in local:
                warnings.append(f"{entry!r} overrides an earlier entry for {key_desc}")
            local[dev] = limit
        else:
            if (worker, dev) in workers:
                warnings.append(f"{entry!r} overrides an earlier entry for {worker}/{dev}")
            workers[(worker, dev)] = limit
    return LimitOverrides(local, workers), warnings


def provider_limit(
    provider: ProviderInfo, offer: DeviceOffer, overrides: LimitOverrides, local_by_uuid: Mapping[str, str]
) -> int:
    """The limit ``provider`` applies to ``offer`` (before the several-providers minimum)."""
    value: int | None
    if provider.is_local:
        value = overrides.local.get(offer.name)
    else:
        value = overrides.workers.get((provider.name, offer.name))
        if value is None and offer.uuid and offer.uuid in local_by_uuid:
            # A same-machine worker without its own override follows this server's limit for the card.
            value = overrides.local.get(local_by_uuid[offer.uuid])
    return default_limit(offer.kind) if value is None else value


