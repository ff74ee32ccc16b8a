"""Wakes long-polls and event streams when a run has new events."""

from __future__ import annotations

from ...common.signals import KeyedSignals


class EventHub(KeyedSignals):
    """Wakes long-polls and streams waiting on a run's new events, keyed by run id (one loop thread, no
    locks): ``waiter(run_id)`` BEFORE reading the store, ``notify(run_id)`` after writing it."""
