"""Slot holders that are not runs (inference unit instances, server/units/): queued with the runs.

An instance asks for a card's slots like a run does and is planned by the same slot rule, in
submission order with the runs, so instances and runs share cards by one rule. Once placed it holds
the slots until released; the dispatcher does not start anything for it (the units' manager does).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from ..scheduling import Candidate, QueuedRun, SlotQueue, SlotState

OnPlaced = Callable[[str, tuple[str, ...]], None]
OnReason = Callable[[str | None], None]


class SlotHolders:
    """The slot-holder part of :class:`~.dispatcher.Dispatcher` (mixed in)."""

    _queue: SlotQueue
    _state: SlotState | None
    _holdings: dict[str, tuple[str, tuple[str, ...]]]
    _reasons: dict[str, str | None]
    _unexplained: set[str]
    # holder id -> (on_placed(provider, devices), on_reason(text), candidates) of queued holders
    _holders: dict[str, tuple[OnPlaced, OnReason, tuple[Candidate, ...]]]

    if TYPE_CHECKING:  # the dispatcher's own
        def wake(self) -> None: ...
        def _release(self, run_id: str) -> None: ...

    def request_slots(self, holder_id: str, candidates: Sequence[Candidate], on_placed: OnPlaced,
                      on_reason: OnReason | None = None) -> None:
        """Queue a holder that is not a run for one of ``candidates``, in submission order with the
        runs; ``on_placed(provider, devices)`` once it holds the slots (until :meth:`release_slots`),
        ``on_reason(text)`` with its waiting reason meanwhile."""
        cands = tuple(candidates)
        self._holders[holder_id] = (on_placed, on_reason or (lambda _text: None), cands)
        self._queue.add(QueuedRun(holder_id, cands))
        self._unexplained.add(holder_id)
        self.wake()

    def hold_slots(self, holder_id: str, provider: str, devices: Sequence[str]) -> None:
        """Count ``holder_id`` on the slots of ``devices`` (placed, or taken over after a restart)."""
        self._holdings[holder_id] = (provider, tuple(devices))
        if self._state is not None:
            self._state.hold(holder_id, provider, tuple(devices))

    def release_slots(self, holder_id: str) -> None:
        """The holder's slots are free again (or its place in the queue is given up)."""
        self._holders.pop(holder_id, None)
        self._reasons.pop(holder_id, None)
        self._unexplained.discard(holder_id)
        self._release(holder_id)

    def _requeue_holders(self) -> None:
        """After the queue was rebuilt from the runs' candidates: the waiting holders go back in, in
        their own order after the runs (a rebuild is rare: a card's mode or a dynamic run changed)."""
        for holder_id, (_placed, _reason, cands) in self._holders.items():
            self._queue.add(QueuedRun(holder_id, cands))
            self._unexplained.add(holder_id)

    def _place_holder(self, holder_id: str, provider: str, devices: tuple[str, ...]) -> bool:
        """Place a holder the plan chose (True), or say it is a run (False)."""
        holder = self._holders.pop(holder_id, None)
        if holder is None:
            return False
        self._queue.remove(holder_id)
        self._reasons.pop(holder_id, None)
        self.hold_slots(holder_id, provider, devices)
        holder[0](provider, tuple(devices))
        return True

    def _tell_holders(self, changed: dict[str, str | None]) -> None:
        """Hand holders their waiting reasons (removed from ``changed``: the store keeps runs only)."""
        for holder_id in [h for h in changed if h in self._holders]:
            self._holders[holder_id][1](changed.pop(holder_id))
