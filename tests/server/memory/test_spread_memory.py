"""A run spread over workers on cards shared by memory (docs/architecture.md "ddp across workers"): its budget
is decided like a device set's, on every card of every part at once. Pure: the candidate split and the
ledger's decision and queue over two workers' cards; in process: a sidecar and two scripted agents."""

from __future__ import annotations

import copy

import scripted_agent as sa  # registered by tests/server/conftest.py

from xpufleet.server.ledger.fit import FITS, GIB, NEVER, NOT_NOW, Ledger
from xpufleet.server.ledger.queue import MemoryQueue, MemoryRun
from xpufleet.server.memory.admission import MemoryAdmission
from xpufleet.server.scheduling import Candidate, DeviceOffer, ProviderInfo, build_state

SPREAD = Candidate("a", ("cuda:0",), (("b", ("cuda:0", "cuda:1")),))

# --- pure --------------------------------------------------------------------------------------------------


class _Store:
    def ensure_schema(self, *args: object) -> None:
        pass

    def set_execution_facts(self, *args: object) -> None:
        pass


class _Dispatcher:
    def __init__(self) -> None:
        self.store = _Store()
        self.providers: dict[str, object] = {}
        self.state = build_state([ProviderInfo(n, tuple(DeviceOffer(f"cuda:{i}", "cuda", f"GPU-{n}-{i}")
                                                       for i in range(2))) for n in "ab"])

    def slot_state(self):
        return self.state


def test_a_spread_candidate_is_split_by_every_part_s_cards_like_a_device_set():
    d = _Dispatcher()
    adm = MemoryAdmission(d.store, d.providers, slot_state=d.slot_state, holdings=dict, queued=dict,
                          wake=lambda: None, notify=lambda _run_id: None, end_run=lambda *_args: None)
    keys = {pair: d.state.index[pair] for pair in SPREAD.pairs}
    assert adm.keys_of(SPREAD) == tuple(keys.values()) and len(keys) == 3
    adm.keys = frozenset(keys.values())
    assert adm.split([SPREAD]).memory == [SPREAD]
    adm.keys = frozenset(k for (w, _), k in keys.items() if w == "a")  # b's cards exclusive: mixed, as a set
    split = adm.split([SPREAD])
    assert split.mixed == [SPREAD] and not split.memory and not split.slot
    adm.keys = frozenset()
    assert adm.split([SPREAD]).slot == [SPREAD]


def _ledger() -> Ledger:
    ledger = Ledger(context_mib=0)
    for key, total in (("a0", 24.0), ("b0", 24.0), ("b1", 16.0)):
        worker, dev = key[0], f"cuda:{key[1]}"
        ledger.set_card(key, f"{dev} on {worker}", "cuda", total_gib=total, free_gib=total)
    return ledger


def test_the_budget_is_decided_on_every_card_of_every_part_all_or_nothing():
    ledger = _ledger()
    cards = ("a0", "b0", "b1")
    # never: too big for one worker's card, refused naming it (as a named device set, wait or not)
    for wait in (None, True):
        d = ledger.decide(20.0, [cards], named=True, wait=wait)
        assert d.action == "reject" and d.reason == "needs 20.0 GiB, more than cuda:1 on b has in all (16.0 GiB)"
    assert ledger.candidate_status(cards, int(20 * GIB)) == NEVER
    # another run holds memory on b's cuda:0: not now; a named run is refused unless it waits
    ledger.hold_running("other", ("b0",), 16.0)
    assert ledger.candidate_status(cards, int(12 * GIB)) == NOT_NOW
    d = ledger.decide(12.0, [cards], named=True)
    assert d.action == "reject" and d.message == ("needs 12.0 GiB, cuda:0 on b has 8.0 GiB free (runs other) (set "
                                                  "target.wait to true to queue it until it fits)")
    assert ledger.decide(12.0, [cards], named=True, wait=True).action == "wait"
    # waiting reserves nothing: a run on a's card starts meanwhile
    queue = MemoryQueue(ledger)
    queue.add(MemoryRun("spread", 12.0, (cards,)))
    queue.add(MemoryRun("small", 4.0, (("a0",),)))
    assert [p.run_id for p in queue.plan()] == ["small"]
    assert ledger.cards["a0"].reserved == {"small": int(4 * GIB)} and not ledger.cards["b1"].reserved
    # b's run ends: the spread run is placed on all three cards at once, and released from all of them
    ledger.release("other")
    (placed,) = queue.plan()
    assert placed.run_id == "spread" and placed.keys == cards
    assert all(ledger.cards[k].reserved.get("spread") == int(12 * GIB) for k in cards)
    ledger.start("spread")
    assert all("spread" in ledger.cards[k].running for k in cards)
    ledger.release("spread")
    assert not any("spread" in ledger.cards[k].runs() for k in cards)
    assert ledger.candidate_status(cards, int(12 * GIB)) == FITS


# --- in process: a sidecar and two scripted agents ------------------------------------------------------

GRAPH = {**sa.IRIS_GRAPH, "7": {"class_type": "XPUTrainingLoop",
                             "inputs": {**sa.IRIS_GRAPH["7"]["inputs"], "strategy": "ddp"}}}
TARGET = [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": ["cuda:0", "cuda:1"]}]


def _cards(prefix: str, total1: float = 24.0) -> list[dict]:
    devices = sa.cards(2, simulated=False, prefix=prefix)
    devices[2]["total_gib"] = devices[2]["free_gib"] = total1
    return devices


async def _memory(sc, worker: str, dev: str) -> dict:
    return next(d["memory"] for d in (await sc.worker(worker))["devices"] if d["name"] == dev)


async def _runs_on(sc, worker: str, dev: str) -> list[tuple[str, str, float | None]]:
    return [(r["id"], r["state"], r["budget_gib"]) for r in (await _memory(sc, worker, dev))["runs"]]


async def test_a_spread_run_on_shared_cards_is_refused_waits_and_starts_with_its_budget_on_every_card(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        a, b = sa.ScriptedAgent(sc, "a", _cards("GPU-a")), sa.ScriptedAgent(sc, "b", _cards("GPU-b", 16.0))
        for agent in (a, b):
            assert (await agent.connect())["type"] == "welcome"
        await sc.share("a", "cuda:0")
        await sc.share("b", "cuda:0", "cuda:1")
        # too big for b's cuda:1 (16 GiB): refused with the ledger's text naming the card and worker
        status, body = await sc.submit(copy.deepcopy(GRAPH), spread=TARGET, memory_gib=20, wait=True)
        assert status == 400 and body["error"].startswith(
            "needs 20.0 GiB (+0.8 GiB CUDA context), more than cuda:1 on b has in all (16.0 GiB)"), body
        # another run holds memory on b's cuda:0
        status, body = await sc.submit(copy.deepcopy(GRAPH), worker="b", devices=["cuda:0"], memory_gib=14)
        assert status == 201, body
        other = body["run_id"]
        assert (await b.recv_type("start_run"))["run_id"] == other
        await b.started(other)
        await sc.status(other, {"running"})
        # a named spread run that does not fit now is refused unless it waits
        status, body = await sc.submit(copy.deepcopy(GRAPH), spread=TARGET, memory_gib=12)
        assert status == 400 and "cuda:0 on b has" in body["error"] and "set target.wait to true" in body["error"]
        status, body = await sc.submit(copy.deepcopy(GRAPH), spread=TARGET, memory_gib=12, wait=True)
        assert status == 201, body
        wide = body["run_id"]
        run = await sc.reason(wide, "waiting for memory")
        assert run["waiting_reason"] == (f"waiting for memory: needs 12.0 GiB (+0.8 GiB CUDA context), cuda:0 "
                                         f"on b has 9.2 GiB free (runs {other[:8]})"), run
        assert run["n_cards"] == 3 and run["budget"]["gib"] == 12.0
        assert await _runs_on(sc, "a", "cuda:0") == []  # all or nothing: nothing reserved while it waits
        # the other run ends: the spread run starts on both workers, its budget on each card
        await b.finish(other)
        await sc.status(other, {"succeeded"})
        start = await a.recv_type("start_run")
        assert start["run_id"] == wide and start["budget_gib"] == 12.0 and start["spread"]["parts"][1] == {
            "worker": "b", "devices": ["cuda:0", "cuda:1"]}
        for worker, dev in (("a", "cuda:0"), ("b", "cuda:0"), ("b", "cuda:1")):
            assert await _runs_on(sc, worker, dev) == [(wide, "reserved", 12.0)], (worker, dev)
        await a.started(wide)
        await sc.status(wide, {"running"})
        await a.event(wide, "ddp_ready", {"store": "127.0.0.1:4000"})
        part = await b.recv_type("start_part")
        assert part["run_id"] == wide and part["budget_gib"] == 12.0 and part["devices"] == ["cuda:0", "cuda:1"]
        # the providers change: the ledger is rebuilt from the runs' slot holdings, b's part (held as
        # "<run id>@b") counted under the run id with its budget
        before = sc.dispatcher.memory.ledger
        c = sa.ScriptedAgent(sc, "c", _cards("GPU-c"))
        assert (await c.connect())["type"] == "welcome"
        await _memory(sc, "c", "cuda:0")
        assert sc.dispatcher.memory.ledger is not before and list(sc.dispatcher.memory.ledger.runs) == [wide]
        for worker, dev in (("a", "cuda:0"), ("b", "cuda:0"), ("b", "cuda:1")):
            assert await _runs_on(sc, worker, dev) == [(wide, "running", 12.0)], (worker, dev)
            assert (await _memory(sc, worker, dev))["running_gib"] == 12.75
        # rank 0's worker's NVML figure shows on its own card only, not on b's cuda:0 of the same name
        await a.heartbeat(runs=[{"run_id": wide, "last_seq": 2, "status": "running", "memory": {"cuda:0": 3.25}}])

        async def use() -> list:
            return [r for r in (await _memory(sc, "a", "cuda:0"))["runs"] if r.get("in_use_gib")]
        assert (await sc.until(use, "NVML use on a's card"))[0]["in_use_gib"] == 3.25
        assert "in_use_gib" not in (await _memory(sc, "b", "cuda:0"))["runs"][0]
        # it ends once every part has: released on every card
        await b.send("part_finished", run_id=wide, part=1, status="succeeded")
        await a.finish(wide)
        await sc.status(wide, {"succeeded"})
        for worker, dev in (("a", "cuda:0"), ("b", "cuda:0"), ("b", "cuda:1")):
            memory = await _memory(sc, worker, dev)
            assert memory["runs"] == [] and memory["running_gib"] == memory["reserved_gib"] == 0
        for agent in (a, b, c):
            await agent.close()


async def test_a_spread_run_mixing_shared_and_exclusive_cards_is_refused_like_a_device_set(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sc:
        a, b = sa.ScriptedAgent(sc, "a", _cards("GPU-a")), sa.ScriptedAgent(sc, "b", _cards("GPU-b"))
        for agent in (a, b):
            await agent.connect()
        await sc.share("b", "cuda:0", "cuda:1")
        status, body = await sc.submit(copy.deepcopy(GRAPH), spread=TARGET, memory_gib=4)
        assert status == 400 and body["error"] == (
            "the device set mixes cards shared by memory and exclusive cards (cuda:0 on a + cuda:0, cuda:1 on "
            "b): make them all shared or all exclusive"), body
        # exclusive cards everywhere: the slot rule as before, a typed budget sent as the cap to every part
        await sc.share("b", "cuda:0", "cuda:1", mode="exclusive")
        status, body = await sc.submit(copy.deepcopy(GRAPH), spread=TARGET, memory_gib=4)
        assert status == 201, body
        start = await a.recv_type("start_run")
        assert start["budget_gib"] == 4.0 and await _memory(sc, "a", "cuda:0") is None
        for agent in (a, b):
            await agent.close()
