"""The agent's runs part (server/agent/runs.py) on its own: its dependencies are a ``send`` callable and
callbacks, so a refused run, the ack that forgets it and a one-shot agent's exit are seen without a
sidecar."""

from __future__ import annotations

import json
from typing import Any

from xpufleet.server.agent.config import AgentConfig
from xpufleet.server.agent.runs import AgentRuns
from xpufleet.server.devices.inventory import Inventory
from xpufleet.server.devices.simulated import parse_simulate


class Wire:
    """What the runs part sends, and its callbacks."""

    def __init__(self, connected: bool = True) -> None:
        self.frames: list[dict[str, Any]] = []
        self.connected = connected
        self.changes = 0
        self.all_done = 0

    async def send(self, text: str) -> bool:
        if self.connected:
            self.frames.append(json.loads(text))
        return self.connected


def _runs(tmp_path, wire: Wire, one_shot: bool = False) -> AgentRuns:
    cfg = AgentConfig(name="box", home=tmp_path, simulate=parse_simulate("cuda:0=24", "box"), one_shot=one_shot)
    inventory = Inventory(cfg.name, cfg.home, cfg.devices, cfg.simulate)

    def changed() -> None:
        wire.changes += 1

    def done() -> None:
        wire.all_done += 1

    return AgentRuns(cfg, inventory, wire.send, offered=inventory.snapshot, resume_grace_s=lambda: 300.0,
                     on_change=changed, on_all_done=done)


async def test_a_run_on_a_card_not_offered_fails_naming_it_and_is_forgotten_once_acked(tmp_path):
    wire = Wire()
    runs = _runs(tmp_path, wire)
    await runs.start({"run_id": "r1", "devices": ["cuda:3"], "graph": {}})
    [frame] = wire.frames
    assert frame["type"] == "event" and frame["event_type"] == "run_finished" and frame["seq"] == 1
    assert frame["payload"]["status"] == "failed"
    assert frame["payload"]["error"].startswith("worker box does not offer cuda:3 (it offers ")
    assert runs.summary() == [{"run_id": "r1", "last_seq": 1, "status": "finished"}] and wire.changes == 1
    runs.ack(runs.table["r1"], 1)
    assert runs.table == {} and runs.summary() == [] and wire.all_done == 0  # not a one-shot agent


async def test_events_sent_while_disconnected_are_replayed_after_the_sidecars_last_seq(tmp_path):
    wire = Wire(connected=False)
    runs = _runs(tmp_path, wire)
    await runs.start({"run_id": "r1", "devices": ["cuda:9"], "graph": {}})
    assert wire.frames == [] and runs.table["r1"].events  # kept for the replay
    replayed: list[str] = []

    async def send_raw(text: str) -> bool:
        replayed.append(text)
        return True

    await runs.reconcile({"r1": 0}, send_raw)
    assert [json.loads(t)["seq"] for t in replayed] == [1]
    await runs.reconcile({}, send_raw)  # the sidecar no longer expects it: forgotten
    assert runs.table == {}


async def test_a_one_shot_agent_refuses_a_second_run_and_is_done_once_both_are_acked(tmp_path):
    wire = Wire()
    runs = _runs(tmp_path, wire, one_shot=True)
    await runs.start({"run_id": "r1", "devices": ["cuda:9"], "graph": {}})
    await runs.start({"run_id": "r2", "devices": ["cuda:0"], "graph": {}})
    second = wire.frames[-1]
    assert second["run_id"] == "r2" and second["payload"]["error"] == (
        "the one-shot agent on worker box already took its one run (r1)")
    runs.ack(runs.table["r1"], 1)
    assert wire.all_done == 0  # r2 is not acked yet
    runs.ack(runs.table["r2"], 1)
    assert wire.all_done == 1 and runs.took_run == "r1"
