"""Keyed change signals, the long-poll wait and stopping tasks (common/signals.py)."""

from __future__ import annotations

import asyncio

from xpufleet.common.signals import KeyedSignals, cancel_and_wait, wait_for_change


async def test_a_signal_taken_before_the_change_is_set_once_and_then_fresh():
    signals = KeyedSignals()
    first = signals.waiter("a")
    assert signals.waiter("a") is first and not first.is_set()
    signals.notify("b")  # nobody waits on b: nothing happens
    signals.notify("a")
    assert first.is_set() and not signals.waiter("a").is_set()
    many = [signals.waiter(k) for k in ("x", "y")]
    signals.notify_all()
    assert all(ev.is_set() for ev in many)


async def test_wait_for_change_returns_on_the_change_not_at_the_timeout():
    signals = KeyedSignals()
    state = {"version": 1}

    async def change() -> None:
        await asyncio.sleep(0)
        state["version"] = 2
        signals.notify("s")

    loop = asyncio.get_running_loop()
    started = loop.time()
    task = asyncio.ensure_future(change())
    await wait_for_change(lambda: state["version"] != 1, lambda: [signals.waiter("s")], timeout=30, recheck_s=0.01)
    assert state["version"] == 2 and loop.time() - started < 10  # a hang would take the 30 s
    await task


async def test_wait_for_change_ends_at_the_timeout_and_with_nothing_to_wait_on():
    signals = KeyedSignals()
    loop = asyncio.get_running_loop()
    started = loop.time()
    await wait_for_change(lambda: False, lambda: [signals.waiter("s")], timeout=0.05, recheck_s=0.01)
    assert loop.time() - started >= 0.05
    checks = []
    await wait_for_change(lambda: checks.append(1) is not None, list, timeout=30, recheck_s=0.01)
    assert checks == [1]


async def test_cancel_and_wait_ends_every_task_whatever_it_raises():
    async def forever() -> None:
        await asyncio.Event().wait()

    async def fails_when_cancelled() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            raise RuntimeError("cleanup failed")

    tasks = [asyncio.ensure_future(forever()), asyncio.ensure_future(fails_when_cancelled())]
    await asyncio.sleep(0)
    await cancel_and_wait(tasks)
    assert all(t.done() for t in tasks)
