"""Providers: what offers devices and starts runs for the dispatcher.

:class:`Provider` is the protocol; :class:`~.local.LocalProvider` is the sidecar's own (target
``local``), :class:`~..workers.provider.WorkerProvider` a worker agent. Both report through the same
:class:`RunHost` calls.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from ..scheduling import DeviceOffer, ProviderInfo

log = logging.getLogger("xpufleet.providers")



class RunHost(Protocol):
    """The run-events interface: what a provider reports to (:class:`~.run_events.RunEvents`)."""

    def ingest(self, run_id: str, events: Sequence[dict[str, Any]]) -> None:
        """Events from the run child, ``{"seq", "type", "payload", "ts"}`` (a replay is stored once)."""

    def run_process_started(self, run_id: str, pid: int | None = None) -> None:
        """The run's process runs (assigned -> running)."""

    def run_ended(self, run_id: str, status: str, error: str | None) -> None:
        """The run's process is gone without a ``run_finished`` event (crash, kill, start failure)."""

    def is_finished(self, run_id: str) -> bool:
        """True once the run has a terminal status."""


@runtime_checkable
class Provider(Protocol):
    """Offers devices and runs queued runs on them.

    ``online`` / ``draining`` are plain attributes (a provider without them is online, not draining).
    ``start_run`` returns once the run is handed over; the run's progress arrives through the
    :class:`RunHost` it was given. ``cancel`` asks for a cooperative stop.
    """

    name: str

    def devices(self) -> list[DeviceOffer]: ...

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None: ...

    async def cancel(self, run_id: str) -> bool: ...


def provider_info(p: Any) -> ProviderInfo:
    """The slot rule's view of a provider object."""
    return ProviderInfo(
        name=p.name,
        devices=tuple(p.devices()),
        online=bool(getattr(p, "online", True)),
        draining=bool(getattr(p, "draining", False)),
        is_local=bool(getattr(p, "is_local", False)),
        mounts=frozenset(getattr(p, "mounts", ()) or ()),
        disabled=bool(getattr(p, "disabled", False)),
        note=str(getattr(p, "note", "") or ""),
        cannot_run=str(getattr(p, "cannot_run", "") or ""),
        comfyui=str(getattr(p, "comfyui_state", "none") or "none"),
        comfyui_reading=getattr(p, "comfyui_reading", None),
    )
