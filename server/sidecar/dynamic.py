"""Dynamic runs (docs/workers.md): queued runs whose candidates depend on providers that come and go.

A pool run's candidates are the pool's live instances; an ``any`` run whose graph reads a storage mount
goes to the workers that declare it; a ComfyUI run goes to the providers whose ComfyUI can run it (one still
reading its ComfyUI makes it wait). Both may have no candidate at submission: they wait with a reason
(the routing's ``note``) and are resolved again whenever providers change; the queue is then rebuilt in
submission order. After a restart they are found again from what was submitted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from ...common.errors import RequestError
from ..run.requests import parse_run_request
from ..scheduling import Candidate, QueuedRun, Resolution, RunTarget, TargetError
from .pool_table import PoolsView


class DynamicRuns:
    """The queued runs resolved again as providers change, and why those without a candidate wait.

    ``store``: the queued targets after a restart; ``resolve(target)``: candidates against the providers
    and pools of now (TargetError when impossible); ``pools``: a pool run's own waiting text."""

    def __init__(self, store: Any, resolve: Callable[[RunTarget], Resolution], pools: PoolsView) -> None:
        self._store = store
        self._resolve = resolve
        self._pools = pools
        self._targets: dict[str, RunTarget] = {}  # queued dynamic runs, in submission order
        self._notes: dict[str, str] = {}  # why those without a candidate yet wait
        # ComfyUI runs found again after a restart: their workers' readings come only as they reconnect, so
        # until one gives them a candidate a refusal is why they wait, not why they fail
        self._lenient: set[str] = set()
        self.due = False  # providers changed since the last resolve()

    def load(self) -> None:
        """After a restart: which queued runs are resolved again as providers come (pool and ``any``
        runs whose graph names mounts, ComfyUI runs), parsed from what was submitted."""
        for row in self._store.queued_targets():
            try:
                target = parse_run_request({"graph": row["graph"], "options": row["options"]}).target
            except RequestError:
                continue
            if target.pool is not None or target.mounts or target.is_comfyui:
                self._targets[row["id"]] = target
            if target.is_comfyui:
                self._lenient.add(row["id"])
        self.due = bool(self._targets)

    def add(self, run_id: str, target: RunTarget, note: str | None) -> None:
        """A dynamic run was queued (``note``: why it has no candidate yet)."""
        self._targets[run_id] = target
        if note:
            self._notes[run_id] = note

    def providers_changed(self) -> None:
        self.due = bool(self._targets)

    def ids(self) -> list[str]:
        return list(self._targets)

    def forget(self, run_id: str) -> None:
        self._targets.pop(run_id, None)
        self._notes.pop(run_id, None)
        self._lenient.discard(run_id)

    def resolve(self, cands: Mapping[str, tuple[Candidate, ...]],
                ) -> tuple[dict[str, tuple[Candidate, ...]], list[tuple[str, str]]]:
        """Resolve the dynamic runs against the providers and pools of now (``cands``: every queued run's
        candidates). Returns the runs whose candidates changed (the caller rebuilds the queue in submission
        order) and the runs that became impossible, with the reason they fail with."""
        self.due = False
        changed: dict[str, tuple[Candidate, ...]] = {}
        failed: list[tuple[str, str]] = []
        for run_id, target in list(self._targets.items()):
            current = cands.get(run_id)
            if current is None:  # no longer queued
                self.forget(run_id)
                continue
            try:
                res = self._resolve(target)
            except TargetError as exc:
                if run_id in self._lenient:
                    self._notes[run_id] = f"{exc} (waiting for the workers to reconnect after the server's restart)"
                    continue
                self.forget(run_id)
                failed.append((run_id, f"the run can no longer be placed: {exc}"))
                continue
            if res.candidates:
                self._lenient.discard(run_id)
            if res.note:
                self._notes[run_id] = res.note
            else:
                self._notes.pop(run_id, None)
            if res.candidates != current:
                changed[run_id] = res.candidates
        return changed, failed

    def waiting_text(self, run_id: str, planned: str | None, queued: QueuedRun | None) -> str | None:
        """The waiting_reason shown: a run with no candidate yet says why; a pool run says which pool."""
        target = self._targets.get(run_id)
        if target is not None and target.pool is not None:
            pooled = self._pools.waiting_reason(target.pool, run_id)
            if pooled:
                return pooled
        if queued is not None and not queued.candidates and run_id in self._notes:
            return self._notes[run_id]
        return planned
