"""The dispatcher's parts (docs/architecture.md, "Components"): the slot book, the pool table, the run-events
interface providers report through, and the card modes given at construction. Real Dispatcher and SQLite
store; a provider that records what it is given."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.scheduling import DeviceOffer
from xpufleet.server.sidecar.dispatcher import Dispatcher
from xpufleet.server.sidecar.pool_table import PoolTable
from xpufleet.server.sidecar.slots import SlotBook

GRAPH = {"1": {"class_type": "XPUDataset", "inputs": {"name": "iris"}}}


class Card:
    """A worker with one CUDA card; ``started`` is set when it is given a run."""

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
    req = parse_run_request({"graph": GRAPH, "options": {"target": {"worker": "w", "devices": ["cuda:0"]}}})
    run_id = d.submit(req)["run_id"]
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
