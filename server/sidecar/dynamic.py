"""Dynamic runs (docs/workers.md): queued runs whose candidates depend on providers that come and go.

A pool run's candidates are the pool's live instances; an ``any`` run whose graph reads a storage mount
goes to the workers that declare it. Both may have no candidate at submission: they wait with a reason
(the routing's ``note``) and are resolved again whenever providers change; the queue is then rebuilt in
submission order. After a restart they are found again from what was submitted.
"""

from __future__ import annotations

from collections.abc import Callable

from ...common.errors import RequestError
from ..scheduling import Candidate, RunTarget, TargetError
from .requests import parse_run_request


class DynamicRuns:
    """The dynamic-run part of :class:`~.dispatcher.Dispatcher` (mixed in)."""

    _cands: dict[str, tuple[Candidate, ...]]  # every queued run's candidates (the dispatcher's)
    _dynamic: dict[str, RunTarget]  # queued dynamic runs, in submission order
    _notes: dict[str, str]  # why those without a candidate yet wait
    _reresolve: bool
    pool_reason: Callable[[str, str], str | None] | None

    def _load_dynamic(self) -> None:
        """After a restart: which queued runs are resolved again as providers come (pool and ``any``
        runs whose graph names mounts), parsed from what was submitted."""
        for row in self.store.queued_targets():
            try:
                target = parse_run_request({"graph": row["graph"], "options": row["options"]}).target
            except RequestError:
                continue
            if target.pool is not None or target.mounts:
                self._dynamic[row["id"]] = target
        self._reresolve = bool(self._dynamic)

    def _resolve_dynamic(self) -> None:
        """Resolve the dynamic runs against the providers and pools of now. When some run's candidates
        changed, the queue is rebuilt from every queued run's candidates in submission order (so runs keep
        their order); a run that became impossible fails with the reason."""
        self._reresolve = False
        changed: dict[str, tuple[Candidate, ...]] = {}
        for run_id, target in list(self._dynamic.items()):
            current = self._cands.get(run_id)
            if current is None:  # no longer queued
                self._forget_dynamic(run_id)
                continue
            try:
                res = self.resolve(target)
            except TargetError as exc:
                self._forget_dynamic(run_id)
                self.run_ended(run_id, "failed", f"the run can no longer be placed: {exc}")
                continue
            if res.note:
                self._notes[run_id] = res.note
            else:
                self._notes.pop(run_id, None)
            if res.candidates != current:
                changed[run_id] = res.candidates
        if not changed:
            return
        self._cands.update(changed)  # same keys: the submission order is kept
        self.store.set_candidates({rid: [c.to_json() for c in cands] for rid, cands in changed.items()})
        self.slot_state()  # providers changed: the slot state and the memory queue follow the new candidates
        self._resplit()

    def _forget_dynamic(self, run_id: str) -> None:
        self._dynamic.pop(run_id, None)
        self._notes.pop(run_id, None)

    def _waiting_text(self, run_id: str, planned: str | None) -> str | None:
        """The waiting_reason shown: a run with no candidate yet says why; a pool run says which pool."""
        target = self._dynamic.get(run_id)
        if target is not None and target.pool is not None and self.pool_reason is not None:
            pooled = self.pool_reason(target.pool, run_id)
            if pooled:
                return pooled
        run = self._queue.get(run_id)
        if run is not None and not run.candidates and run_id in self._notes:
            return self._notes[run_id]
        return planned
