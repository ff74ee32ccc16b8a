"""The resume grace (docs/workers.md): a worker that disconnects keeps its runs for
``XPUFLEET_WORKER_RESUME_GRACE_S``; after it they end ``interrupted``. After a sidecar restart the same applies
from the start: runs still running on a worker are taken over when its agent reconnects."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from . import protocol
from .context import PartContext
from .state import WorkerState

log = logging.getLogger("xpufleet.workers")


class ResumeGrace:
    """Each disconnected worker's timer, and what happens to its runs when it runs out."""

    def __init__(self, ctx: PartContext, maybe_depart: Callable[[WorkerState], bool]) -> None:
        """``ctx``: the table and the dispatcher (runs ended); ``maybe_depart``: forgets a one-shot instance
        that left."""
        self.ctx = ctx
        self.maybe_depart = maybe_depart
        self._started = False

    def start(self) -> None:
        """After the dispatcher recovered: every worker with runs still active gets its resume grace.

        Runs the sidecar had sent to a worker before it restarted are taken over when the worker's
        agent reconnects and lists them; those of a worker that does not come back within the grace end
        ``interrupted``.
        """
        if self._started:
            return
        self._started = True
        workers = self.ctx.workers
        for name in sorted({r["worker_id"] for r in self.ctx.table.active_runs()}):
            st = workers.get(name)
            if st is None:  # a run on a worker removed meanwhile
                st = workers[name] = WorkerState(name=name, created_at=time.time())
            if not st.online:
                st.disconnected_at = time.monotonic()
                self.schedule(st)

    def schedule(self, st: WorkerState) -> None:
        """(Re)start the worker's grace timer."""
        if st.grace_handle is not None:
            st.grace_handle.cancel()
        loop = asyncio.get_running_loop()
        st.grace_handle = loop.call_later(protocol.resume_grace_s(), self.expired, st.name)

    def expired(self, name: str) -> None:
        """The grace ran out: the worker's runs end ``interrupted`` (unless it came back)."""
        st = self.ctx.workers.get(name)
        if st is not None:
            st.grace_handle = None
            if st.online:
                return
        grace = protocol.resume_grace_s()
        for run in self.ctx.table.active_runs(name):
            log.warning("run %s: worker %s stayed away longer than the resume grace; interrupted", run["id"], name)
            self.ctx.runs.run_ended(
                run["id"], "interrupted",
                f"worker {name} was disconnected for more than {grace:g} s (XPUFLEET_WORKER_RESUME_GRACE_S); "
                f"the run was interrupted",
            )
        if st is not None:
            self.maybe_depart(st)  # a one-shot instance that did not come back has left

    def cancel_all(self) -> None:
        """Server stopping: no timer fires after it."""
        for st in self.ctx.workers.values():
            if st.grace_handle is not None:
                st.grace_handle.cancel()
                st.grace_handle = None
