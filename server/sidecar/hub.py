"""Wakes long-polls and event streams when a run has new events."""

from __future__ import annotations

import asyncio


class EventHub:
    """Wakes long-polls and streams waiting on a run's new events (one loop thread, no locks)."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def waiter(self, run_id: str) -> asyncio.Event:
        """Get the event to await BEFORE reading the store, so no notification falls in between."""
        ev = self._events.get(run_id)
        if ev is None:
            ev = self._events[run_id] = asyncio.Event()
        return ev

    def notify(self, run_id: str) -> None:
        ev = self._events.pop(run_id, None)
        if ev is not None:
            ev.set()

    def notify_all(self) -> None:
        for run_id in list(self._events):
            self.notify(run_id)
