"""Wakes long-polls and event streams when a run has new events, and takes their turns at reading pages."""

from __future__ import annotations

import asyncio

from ...common.signals import KeyedSignals
from ...constants import EVENTS_STREAM_PAGES_AT_ONCE


class EventHub(KeyedSignals):
    """Wakes long-polls and streams waiting on a run's new events, keyed by run id (one loop thread, no
    locks): ``waiter(run_id)`` BEFORE reading the store, ``notify(run_id)`` after writing it.

    ``page_turns``: a reader of a large history holds it while it reads and encodes one page and lets the
    loop go round once, so however many streams are open, each turn of the event loop runs at most
    ``EVENTS_STREAM_PAGES_AT_ONCE`` pages besides everything else (health, heartbeats), and the streams
    take their turns in order (docs/events.md "Reading a large run")."""

    def __init__(self) -> None:
        super().__init__()
        self.page_turns = asyncio.Semaphore(EVENTS_STREAM_PAGES_AT_ONCE)
