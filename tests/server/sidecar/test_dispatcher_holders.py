"""Slot holders that are not runs (inference unit instances) share cards with runs by the slot rule:
queued in submission order with the runs, holding a card until released, with a waiting reason."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.scheduling import Candidate, DeviceOffer
from xpufleet.server.sidecar.dispatcher import Dispatcher


class CardProvider:
    """A worker with one card that records the runs it is given."""

    is_local = False
    online = True
    draining = False

    def __init__(self, name: str) -> None:
        self.name = name
        self.started: list[str] = []
        self.changed = asyncio.Event()

    def devices(self) -> list[DeviceOffer]:
        return [DeviceOffer("cuda:0", "cuda", uuid=f"GPU-{self.name}")]

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        self.started.append(run["id"])
        self.changed.set()

    async def cancel(self, run_id: str) -> bool:
        return True


async def _until(pred, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "the condition did not come true"
        await asyncio.sleep(0.01)


def _submit(d: Dispatcher) -> str:
    req = parse_run_request({"graph": harness.iris_graph(1), "options": {"target": {"worker": "w1", "devices": ["cuda:0"]}}})
    return d.submit(req)["run_id"]


@pytest.fixture
async def d(store, tmp_path):
    """A dispatcher (not started), shut down at teardown, also when the test failed."""
    dispatcher = Dispatcher(store, tmp_path, validate_local_graphs=False)
    yield dispatcher
    await dispatcher.shutdown()


async def test_instances_and_runs_share_a_card_in_submission_order(store, d):
    w1 = CardProvider("w1")
    d.register_provider(w1)
    await d.start()
    cand = [Candidate("w1", ("cuda:0",))]
    placed: list[tuple[str, str, tuple[str, ...]]] = []
    reasons: dict[str, str | None] = {}

    def on_placed(holder: str):
        return lambda provider, devices: placed.append((holder, provider, devices))

    # an instance takes the free card; a run submitted after it waits, with its reason
    d.request_slots("unit:s-1/0", cand, on_placed("unit:s-1/0"))
    await _until(lambda: placed)
    assert placed == [("unit:s-1/0", "w1", ("cuda:0",))]
    r1 = _submit(d)
    await _until(lambda: store.get_run(r1)["waiting_reason"])
    assert w1.started == [] and "cuda:0 on w1" in store.get_run(r1)["waiting_reason"]
    # a second instance queued after the run waits behind it (submission order), with a reason
    d.request_slots("unit:s-2/0", cand, on_placed("unit:s-2/0"),
                    on_reason=lambda text: reasons.__setitem__("unit:s-2/0", text))
    await _until(lambda: reasons.get("unit:s-2/0"))
    d.release_slots("unit:s-1/0")
    await _until(lambda: w1.started == [r1])
    assert len(placed) == 1  # the run came first
    d.run_ended(r1, "succeeded", None)
    await _until(lambda: len(placed) == 2)
    assert placed[1][0] == "unit:s-2/0"
    # a holder taken over after a restart counts too; a queued holder can give its place up
    d.release_slots("unit:s-2/0")
    d.hold_slots("unit:s-3/0", "w1", ["cuda:0"])
    r2 = _submit(d)
    d.request_slots("unit:s-4/0", cand, on_placed("unit:s-4/0"))
    await _until(lambda: store.get_run(r2)["waiting_reason"])  # a pass planned both: neither placed
    assert w1.started == [r1] and len(placed) == 2
    d.release_slots("unit:s-4/0")  # leaves the queue without ever holding the card
    d.release_slots("unit:s-3/0")
    await _until(lambda: w1.started == [r1, r2])
    assert len(placed) == 2


async def test_a_queue_rebuild_keeps_the_waiting_holders(store, d):
    """The queue is rebuilt from the runs' candidates when a card's mode or a dynamic run changes
    (``_resplit``): a holder waiting then is still queued afterwards and is placed when the card frees."""
    w1 = CardProvider("w1")
    d.register_provider(w1)
    await d.start()
    cand = [Candidate("w1", ("cuda:0",))]
    placed: list[str] = []
    r1 = _submit(d)
    await _until(lambda: w1.started == [r1])
    d.request_slots("unit:s-1/0", cand, lambda provider, devices: placed.append(provider))
    r2 = _submit(d)
    await _until(lambda: store.get_run(r2)["waiting_reason"])
    d._resplit()  # what a mode change or a dynamic run's new candidates do
    assert "unit:s-1/0" in d._queue and r2 in d._queue
    d.run_ended(r1, "succeeded", None)
    await _until(lambda: w1.started == [r1, r2])  # after a rebuild the holders queue after the runs
    assert placed == []
    d.run_ended(r2, "succeeded", None)
    await _until(lambda: placed == ["w1"])  # still queued: placed once the card is free
