"""The run-events interface (docs/sidecar.md): what the providers report about a run, in one place.

The sidecar's local provider and every worker's provider report through the same four calls
(:class:`~.providers.RunHost`): a run child's events, its process started, its process gone without a
result, and whether it has ended. Each call writes the store, tells the memory part and wakes the run's
watchers; a run that ended frees its slots through ``release`` (the dispatcher's, which plans again).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ...common.errors import StoreError
from ...constants import TERMINAL_STATUSES
from ..memory.admission import MemoryAdmission
from ..run.events import NewEvent
from .store import Store

log = logging.getLogger("xpufleet.dispatcher")

EventFilter = Callable[[str, list[Any]], list[Any]]


class RunEvents:
    """Stores what providers report (see the module docstring).

    ``notify(run_id)``: the run's watchers; ``memory``: budgets, peaks and the ledger; ``release(run_id)``:
    the run no longer holds or waits for slots; ``before(run_id, events)``: the events as the run keeps
    them (a spread run's end waits for its other workers, spread.py)."""

    def __init__(self, store: Store, notify: Callable[[str], None], memory: MemoryAdmission,
                 release: Callable[[str], None], before: EventFilter) -> None:
        self._store = store
        self._notify = notify
        self._memory = memory
        self._release = release
        self._before = before

    def ingest(self, run_id: str, events: Sequence[Mapping[str, Any]]) -> None:
        """Store a run child's events (deduplicated by ``seq``); ``run_finished`` ends the run."""
        events = self._before(run_id, list(events))
        batch = []
        for ev in events:
            payload = ev.get("payload")
            ts = ev.get("ts")
            if ev.get("type") == "run_finished" and isinstance(payload, Mapping):
                payload = self._memory.finishing(run_id, dict(payload))  # an OOM under a budget says whose
            batch.append(NewEvent(
                type=str(ev.get("type")),
                payload=payload if isinstance(payload, Mapping) else {"value": payload},
                ts=float(ts) if isinstance(ts, int | float) else None,
                source_seq=int(ev["seq"]) if isinstance(ev.get("seq"), int) else None,
            ))
        try:
            result = self._store.append_events(run_id, batch)
        except StoreError:
            log.warning("events for unknown run %s dropped", run_id)
            return
        for ev in batch:
            if ev.type == "run_started" and result.stored:  # facts visible while it runs
                p = ev.payload
                facts = {k: p[k] for k in ("pid", "placement") if k in p}
                if "devices" in p:
                    facts["run_devices"] = p["devices"]
                if "device_aliases" in p:
                    facts["device_aliases"] = p["device_aliases"]
                self._store.set_execution_facts(run_id, facts)
        if result.finished is not None:
            finished = next(ev for ev in reversed(batch) if ev.type == "run_finished")
            self._memory.finished(run_id, result.finished, finished.payload.get("peak_memory"))
            self._release(run_id)
        if result.stored:
            self._notify(run_id)

    def run_process_started(self, run_id: str, pid: int | None = None) -> None:
        """The run's process runs (assigned -> running)."""
        if self._store.mark_running(run_id, pid=pid):
            self._memory.started(run_id)
            self._notify(run_id)

    def run_ended(self, run_id: str, status: str, error: str | None) -> None:
        """The run's process is gone without having reported ``run_finished``."""
        if self._store.finish(run_id, status, error=error):
            self._memory.finished(run_id, status, None)
            self._notify(run_id)
        self._release(run_id)

    def is_finished(self, run_id: str) -> bool:
        """True once the run has a terminal status."""
        run = self._store.get_run(run_id)
        return run is None or run["status"] in TERMINAL_STATUSES
