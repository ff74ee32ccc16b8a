"""The dispatcher's parts (docs/architecture.md, "Components"): the slot book, the pool table, the run-events
interface providers report through, the card modes given at construction, and the slot holders that are not
runs (inference unit instances), which share cards with runs by the slot rule: queued in submission order
with the runs, holding a card until released, with a waiting reason. Real Dispatcher and SQLite store;
a provider that records what it is given."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.scheduling import Candidate, DeviceOffer
from xpufleet.server.sidecar.dispatcher import Dispatcher
from xpufleet.server.sidecar.pool_table import PoolTable
from xpufleet.server.sidecar.slots import SlotBook

GRAPH = {"1": {"class_type": "XPUDataset", "inputs": {"name": "iris"}}}


class Card:
    """A worker with one CUDA card: ``runs`` lists the runs it is given, ``started`` is set at the first."""

    is_local, online, draining = False, True, False

    def __init__(self, name: str) -> None:
        self.name = name
        self.runs: list[str] = []
        self.started = asyncio.Event()

    def devices(self) -> list[DeviceOffer]:
        return [DeviceOffer("cuda:0", "cuda", uuid=f"GPU-{self.name}")]

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        self.runs.append(run["id"])
        self.started.set()

    async def cancel(self, run_id: str) -> bool:
        return True


@pytest.fixture
async def make(store, tmp_path):
    """Dispatchers over ``store`` (keyword arguments: the constructor's), shut down at teardown."""
    made: list[Dispatcher] = []

    def new(**kw: Any) -> Dispatcher:
        made.append(Dispatcher(store, tmp_path, validate_local_graphs=False, **kw))
        return made[-1]

    yield new
    for d in made:
        await d.shutdown()


async def _until(pred, timeout: float = 10.0) -> None:
    """Wait for the dispatcher (it acts on its own tasks) to make ``pred()`` true; bounded."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        assert loop.time() < deadline, "the condition did not come true"
        await asyncio.sleep(0.01)


def _submit(d: Dispatcher, worker: str = "w1") -> str:
    """A run for ``worker``'s cuda:0; its id."""
    req = parse_run_request({"graph": GRAPH, "options": {"target": {"worker": worker, "devices": ["cuda:0"]}}})
    return d.submit(req)["run_id"]


def test_the_slot_book_keeps_its_state_current_and_rebuilds_it_with_the_holdings():
    book = SlotBook()
    book.providers["w"] = Card("w")
    book.hold("early", "w", ("cuda:0",))  # before the state exists: counted when it is built
    state = book.state()
    assert state.slots["uuid:GPU-w"].holders == ["early"] and book.state() is state
    assert book.release("early") and not book.release("early")
    assert state.slots["uuid:GPU-w"].used == 0
    book.hold("late", "w", ("cuda:0",))
    assert state.slots["uuid:GPU-w"].holders == ["late"]
    book.invalidate()  # providers changed: a new state, with the holdings kept
    assert book.state() is not state and book.state().slots["uuid:GPU-w"].holders == ["late"]


def test_the_pool_table_is_empty_until_filled_and_keeps_its_reason():
    table = PoolTable()
    assert table.live() == {} and table.closed() == {} and table.waiting_reason("p", "r") is None
    table.update({"p": ["p-1"]}, {"q": "revoked"}, lambda pool, run_id: f"{pool}:{run_id}")
    table.update({"p": []}, {})  # a later update without a reason keeps the one given
    assert table.live() == {"p": []} and table.closed() == {} and table.waiting_reason("p", "r") == "p:r"


async def test_card_modes_given_at_construction_decide_which_cards_admit_by_memory(make):
    exclusive = make()
    shared = make(mode_of=lambda worker, device: "shared" if (worker, device) == ("w", "cuda:0") else "exclusive")
    for d in (exclusive, shared):
        d.register_provider(Card("w"))
        d.slot_state()
    assert exclusive.memory.keys == frozenset()
    assert shared.memory.keys == frozenset({"uuid:GPU-w"})


async def test_a_run_reported_through_the_run_events_interface_ends_and_frees_its_card(store, make):
    pools = PoolTable()
    d = make(pools=pools)
    assert d.pool_table is pools
    card = Card("w")
    d.register_provider(card)
    await d.start()
    run_id = _submit(d, "w")
    await asyncio.wait_for(card.started.wait(), 10)
    assert d.holdings() == {run_id: ("w", ("cuda:0",))}
    woke = d.hub.waiter(run_id)
    events = d.events  # what a provider is given to report to
    events.run_process_started(run_id, 4242)
    assert store.get_run(run_id)["status"] == "running" and woke.is_set()
    assert not events.is_finished(run_id)
    events.ingest(run_id, [{"seq": 1, "type": "run_started", "payload": {"pid": 4242, "devices": ["cuda:0"]}},
                           {"seq": 2, "type": "run_finished", "payload": {"status": "succeeded"}}])
    events.ingest(run_id, [{"seq": 2, "type": "run_finished", "payload": {"status": "succeeded"}}])  # a replay
    run = store.get_run(run_id)
    assert run["status"] == "succeeded" and run["execution_facts"]["run_devices"] == ["cuda:0"]
    assert events.is_finished(run_id) and d.holdings() == {}
    assert d.slot_state().slots["uuid:GPU-w"].used == 0


async def test_instances_and_runs_share_a_card_in_submission_order(store, make):
    d = make()
    w1 = Card("w1")
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
    assert w1.runs == [] and "cuda:0 on w1" in store.get_run(r1)["waiting_reason"]
    # a second instance queued after the run waits behind it (submission order), with a reason
    d.request_slots("unit:s-2/0", cand, on_placed("unit:s-2/0"),
                    on_reason=lambda text: reasons.__setitem__("unit:s-2/0", text))
    await _until(lambda: reasons.get("unit:s-2/0"))
    d.release_slots("unit:s-1/0")
    await _until(lambda: w1.runs == [r1])
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
    assert w1.runs == [r1] and len(placed) == 2
    d.release_slots("unit:s-4/0")  # leaves the queue without ever holding the card
    d.release_slots("unit:s-3/0")
    await _until(lambda: w1.runs == [r1, r2])
    assert len(placed) == 2


async def test_a_queue_rebuild_keeps_the_waiting_holders(store, make):
    """The queue is rebuilt from the runs' candidates when a card's mode or a dynamic run changes
    (``_resplit``): a holder waiting then is still queued afterwards and is placed when the card frees."""
    d = make()
    w1 = Card("w1")
    d.register_provider(w1)
    await d.start()
    cand = [Candidate("w1", ("cuda:0",))]
    placed: list[str] = []
    r1 = _submit(d)
    await _until(lambda: w1.runs == [r1])
    d.request_slots("unit:s-1/0", cand, lambda provider, devices: placed.append(provider))
    r2 = _submit(d)
    await _until(lambda: store.get_run(r2)["waiting_reason"])
    d._resplit()  # what a mode change or a dynamic run's new candidates do
    assert "unit:s-1/0" in d._queue and r2 in d._queue
    d.run_ended(r1, "succeeded", None)
    await _until(lambda: w1.runs == [r1, r2])  # after a rebuild the holders queue after the runs
    assert placed == []
    d.run_ended(r2, "succeeded", None)
    await _until(lambda: placed == ["w1"])  # still queued: placed once the card is free
