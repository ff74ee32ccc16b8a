"""The sidecar's side of ddp across workers (server/sidecar/spread.py) against a stand-in dispatcher:
the other parts start on ``ddp_ready``, rank 0's result waits for them, and the root cause wins over
its consequences (a real sidecar and agents: tests/server/workers/test_spread_e2e.py)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from xpufleet.server.scheduling import DeviceOffer
from xpufleet.server.sidecar.slots import SlotBook
from xpufleet.server.sidecar.spread import SpreadRuns, holder_id


class Worker:
    def __init__(self, name: str) -> None:
        self.name, self.online, self.sent, self.peer = name, True, [], "127.0.0.1"

    def devices(self) -> list[DeviceOffer]:
        return [DeviceOffer("cuda:0")]

    async def send(self, mtype: str, **fields: Any) -> bool:
        self.sent.append((mtype, fields))
        return self.online


class Store:
    def __init__(self) -> None:
        self.facts: dict[str, Any] = {}

    def set_execution_facts(self, run_id: str, facts: dict[str, Any]) -> None:
        self.facts.update(facts)

    def get_run(self, run_id: str, with_graph: bool = False) -> dict[str, Any]:
        return {"id": run_id, "graph": {"7": {}}, "options": {}, "budget_gib": None}

    def active(self) -> list[dict[str, Any]]:
        return []


class Events:
    """The run-events interface the spread part reports to (records what it is told)."""

    def __init__(self) -> None:
        self.ingested: list[Any] = []
        self.ended: list[tuple[str, str, str | None]] = []
        self.arrived = asyncio.Event()

    def ingest(self, run_id: str, events: Any) -> None:
        self.ingested += events
        self.arrived.set()

    def run_process_started(self, run_id: str, pid: int | None = None) -> None:
        raise AssertionError("the spread part never starts a process")

    def run_ended(self, run_id: str, status: str, error: str | None) -> None:
        self.ended.append((run_id, status, error))

    def is_finished(self, run_id: str) -> bool:
        return False


class Parts:
    """A spread part over a real slot book with workers a and b (one card each; run r holds a's), a store
    stand-in and the run-events stand-in; its background tasks are kept to be awaited."""

    def __init__(self) -> None:
        self.slots = SlotBook()
        self.providers = self.slots.providers
        self.providers.update({"a": Worker("a"), "b": Worker("b")})
        self.slots.hold("r", "a", ("cuda:0",))
        self.store = Store()
        self.events = Events()
        self.tasks: list[asyncio.Task[Any]] = []
        self.spread = SpreadRuns(self.store, self.slots, self.events, self._spawn)

    def _spawn(self, coro: Any) -> None:
        self.tasks.append(asyncio.get_running_loop().create_task(coro))

    @property
    def ingested(self) -> list[Any]:
        return self.events.ingested

    @property
    def ended(self) -> list[tuple[str, str, str | None]]:
        return self.events.ended


@pytest.fixture
async def parts():
    """New :class:`Parts` per call; every task they started is cancelled at teardown, also on a failure."""
    made: list[Parts] = []

    def new() -> Parts:
        made.append(Parts())
        return made[-1]

    yield new
    for d in made:
        for t in d.tasks:
            t.cancel()


def finished(status: str, error: str | None = None, peer_lost: bool = False) -> dict[str, Any]:
    payload: dict[str, Any] = {"status": status, "error": error, "execution_facts": {}}
    if peer_lost:
        payload["ddp_peer_lost"] = True
    return {"type": "run_finished", "seq": 9, "payload": payload}


async def _placed(d: Parts) -> tuple[Parts, SpreadRuns]:
    s = d.spread
    layout = s.placed("r", "a", ("cuda:0",), (("b", ("cuda:0",)),))
    assert layout["parts"][1] == {"worker": "b", "devices": ["cuda:0"]} and layout["part"] == 0
    assert d.slots.state().slots["b/cuda:0"].holders == [holder_id("r", "b")] and d.store.facts["world_size"] == 2
    assert s.filter("r", [{"type": "ddp_ready", "payload": {"store": "127.0.0.1:4000"}}])
    await asyncio.gather(*d.tasks)
    ((mtype, fields),) = d.providers["b"].sent
    assert mtype == "start_part" and fields["spread"]["store"] == "127.0.0.1:4000" and fields["spread"]["part"] == 1
    return d, s


async def test_rank_0_s_result_waits_for_the_other_part_and_a_killed_rank_there_is_the_run_s_error(parts):
    d, s = await _placed(parts())
    assert s.filter("r", [finished("failed", "Node 7 failed: DdpPeerLost: rank 0 lost contact", True)]) == []
    assert d.ingested == []  # held: rank 1 on b has not reported yet
    await s.on_part_finished("b", {"run_id": "r", "part": 1, "status": "failed", "failed_rank": 1,
                                   "error": "DDP rank 1 of 2 failed on worker b: killed by SIGKILL"})
    (ev,) = d.ingested
    assert ev["payload"]["status"] == "failed"
    assert ev["payload"]["error"] == "DDP rank 1 of 2 failed on worker b: killed by SIGKILL"
    facts = ev["payload"]["execution_facts"]
    assert facts["ddp_rank0_error"].startswith("Node 7 failed") and facts["ddp_failed_worker"] == "b"
    assert "ddp_peer_lost" not in ev["payload"]
    s.release("r")
    assert d.slots.state().slots["b/cuda:0"].used == 0 and "r" not in s.runs


async def test_a_part_s_worker_disconnecting_stops_rank_0_and_is_named_even_when_rank_0_ends_cancelled(parts):
    d, s = await _placed(parts())
    s.on_connection("b", False)
    await asyncio.gather(*d.tasks)
    assert ("cancel_run", {"run_id": "r", "reason": "stopped: DDP rank 1 of 2 failed on worker b: worker b "
                           "disconnected (its agent stopped or lost its connection); see output-rank1.log on "
                           "worker b"}) in d.providers["a"].sent
    (ev,) = s.filter("r", [finished("cancelled", "cancelled by request")])
    assert ev["payload"]["status"] == "failed" and ev["payload"]["error"].startswith(
        "DDP rank 1 of 2 failed on worker b: worker b disconnected")


async def test_rank_0_s_own_failure_and_a_user_s_stop_stay_the_run_s_result(parts):
    d, s = await _placed(parts())
    assert s.filter("r", [finished("failed", "Node 7 failed: ValueError: bad")]) == []
    await asyncio.gather(*d.tasks)
    assert d.providers["b"].sent[-1][0] == "stop_part"  # rank 0 ended: the other ranks are told to stop
    await s.on_part_finished("b", {"run_id": "r", "part": 1, "status": "failed", "peer_lost": True,
                                   "error": "the ranks on worker b lost contact with the other ranks"})
    (ev,) = d.ingested
    assert ev["payload"]["error"] == "Node 7 failed: ValueError: bad"
    assert ev["payload"]["execution_facts"]["spread_parts"][1]["status"] == "failed"
    d2, s2 = await _placed(parts())
    await s2.on_part_finished("b", {"run_id": "r", "part": 1, "status": "cancelled"})
    (ev2,) = s2.filter("r", [finished("cancelled", "cancelled")])
    assert ev2["payload"]["status"] == "cancelled"


async def test_rank_0_s_worker_gone_fails_the_run_naming_rank_0_once_the_others_lost_it(parts):
    d, s = await _placed(parts())
    d.providers["a"].online = False
    await s.on_part_finished("b", {"run_id": "r", "part": 1, "status": "failed", "peer_lost": True})
    assert d.ended == [("r", "failed", "DDP rank 0 of 2 failed on worker a: worker a disconnected (its agent "
                                       "stopped or lost its connection); see output-rank0.log on worker a")]


async def test_rank_0_s_worker_gone_after_the_others_reported_losing_it_fails_the_run_naming_rank_0(parts):
    # The other order (found under load): b's part reports losing its peer while a still counts as online,
    # then the sidecar notices a's disconnect. Before, nothing ended the run until the resume grace.
    d, s = await _placed(parts())
    await s.on_part_finished("b", {"run_id": "r", "part": 1, "status": "failed", "peer_lost": True})
    assert d.ended == []  # rank 0 may still report (its worker is online)
    d.providers["a"].online = False
    s.on_connection("a", False)
    assert d.ended == [("r", "failed", "DDP rank 0 of 2 failed on worker a: worker a disconnected (its agent "
                                       "stopped or lost its connection); see output-rank0.log on worker a")]
    s.on_connection("a", False)  # a second notice changes nothing
    assert len(d.ended) == 1


async def test_a_part_that_never_reports_does_not_hold_the_result_past_the_wait(monkeypatch, parts):
    import xpufleet.server.sidecar.spread as mod

    monkeypatch.setattr(mod, "SPREAD_PARTS_WAIT_S", 0.05)

    d, s = await _placed(parts())
    assert s.filter("r", [finished("succeeded")]) == []
    await asyncio.wait_for(d.events.arrived.wait(), 10)  # the wait of 0.05 s ran out
    (ev,) = d.ingested
    assert ev["payload"]["status"] == "succeeded"


async def test_a_loopback_store_that_a_worker_on_another_machine_cannot_reach_fails_the_run_at_once(parts):
    d = parts()
    d.providers["b"].peer = "10.0.0.7"
    s = d.spread
    s.placed("r", "a", ("cuda:0",), (("b", ("cuda:0",)),))
    s.filter("r", [{"type": "ddp_ready", "payload": {"store": "127.0.0.1:4000"}}])
    await asyncio.gather(*d.tasks)
    assert not [m for m, _ in d.providers["b"].sent if m == "start_part"]
    (mtype, fields), = [x for x in d.providers["a"].sent if x[0] == "cancel_run"]
    assert "a loopback address that worker b (connected from 10.0.0.7" in fields["reason"]
    assert "--advertise-addr" in fields["reason"]
