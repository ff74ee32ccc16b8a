"""Slot holders that are not runs (inference unit instances, server/units/): queued with the runs.

An instance asks for a card's slots like a run does and is planned by the same slot rule, in
submission order with the runs, so instances and runs share cards by one rule. Once placed it holds
the slots until released; the dispatcher does not start anything for it (the units' manager does).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from ..scheduling import Candidate

OnPlaced = Callable[[str, tuple[str, ...]], None]
OnReason = Callable[[str | None], None]


class SlotHolders:
    """The holders waiting in the dispatcher's queue: their candidates and their two callbacks (the
    dispatcher queues them; this part answers which queued ids are holders and tells them)."""

    def __init__(self) -> None:
        # holder id -> (on_placed(provider, devices), on_reason(text), candidates) of queued holders
        self._waiting: dict[str, tuple[OnPlaced, OnReason, tuple[Candidate, ...]]] = {}

    def add(self, holder_id: str, candidates: Sequence[Candidate], on_placed: OnPlaced,
            on_reason: OnReason | None = None) -> tuple[Candidate, ...]:
        """A holder joins the queue; returns its candidates (the dispatcher queues it with them)."""
        cands = tuple(candidates)
        self._waiting[holder_id] = (on_placed, on_reason or (lambda _text: None), cands)
        return cands

    def discard(self, holder_id: str) -> None:
        """The holder gave up its place (or was placed)."""
        self._waiting.pop(holder_id, None)

    def queued(self) -> Iterator[tuple[str, tuple[Candidate, ...]]]:
        """The waiting holders in their own order (queued again after the runs when the queue is rebuilt:
        a rebuild is rare, a card's mode or a dynamic run changed)."""
        for holder_id, (_placed, _reason, cands) in self._waiting.items():
            yield holder_id, cands

    def take(self, holder_id: str) -> OnPlaced | None:
        """The plan chose ``holder_id``: its on_placed, or None when it is a run."""
        holder = self._waiting.pop(holder_id, None)
        return holder[0] if holder is not None else None

    def tell(self, changed: dict[str, str | None]) -> None:
        """Hand holders their waiting reasons (removed from ``changed``: the store keeps runs only)."""
        for holder_id in [h for h in changed if h in self._waiting]:
            self._waiting[holder_id][1](changed.pop(holder_id))
