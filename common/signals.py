"""Waiting on changes in one event loop: keyed change signals, a long-poll's wait, and stopping tasks.

A long-poll takes its signal BEFORE it reads the state, so no change falls between the read and the wait
(the run hub's waiters of ``GET /api/runs/{id}/events``, a study's changes, a sweep's runs).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable


class KeyedSignals:
    """One-shot change signals by key (a run id, a study id): :meth:`notify` wakes every waiter of a key once.

    One loop thread, no locks."""

    def __init__(self) -> None:
        self._events: dict[str, asyncio.Event] = {}

    def waiter(self, key: str) -> asyncio.Event:
        """The event set at ``key``'s next change: get it BEFORE reading, so no notification falls in between."""
        ev = self._events.get(key)
        if ev is None:
            ev = self._events[key] = asyncio.Event()
        return ev

    def notify(self, key: str) -> None:
        """``key`` changed: wake its waiters (the next :meth:`waiter` is a fresh event)."""
        ev = self._events.pop(key, None)
        if ev is not None:
            ev.set()

    def notify_all(self) -> None:
        """Every key changed (a restart, a shutdown)."""
        for key in list(self._events):
            self.notify(key)


async def wait_for_change(done: Callable[[], bool], signals: Callable[[], list[asyncio.Event]], timeout: float,
                          recheck_s: float) -> None:
    """Return once ``done()`` holds or ``timeout`` seconds have passed. ``signals()`` gives the events that
    announce a change (taken before each ``done()`` check); one that fires is only a hint (a run's news is
    mostly progress), so ``done()`` is looked at again at most every ``recheck_s``. With no signal to wait
    on, it returns after the first check."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        waiters = [asyncio.ensure_future(ev.wait()) for ev in signals()]  # before the check
        try:
            left = deadline - loop.time()
            if done() or left <= 0 or not waiters:
                return
            await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waiters:
                w.cancel()
        await asyncio.sleep(min(recheck_s, max(0.0, deadline - loop.time())))


async def cancel_and_wait(tasks: Iterable[asyncio.Task[object] | asyncio.Future[object]]) -> None:
    """Cancel every task, then wait until each has ended (what it raised is its own business: a stopping
    owner only needs it gone)."""
    tasks = list(tasks)
    for t in tasks:
        t.cancel()
    for t in tasks:
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await t
