"""A stopping agent waits for the server's acks of its runs' last events, not for a fixed time."""

from __future__ import annotations

import asyncio
import time

from xpufleet.server.agent.agent import Agent
from xpufleet.server.agent.config import AgentConfig
from xpufleet.server.agent.runs import RunState
from xpufleet.server.devices.simulated import parse_simulate


def _agent(tmp_path) -> tuple[Agent, RunState]:
    agent = Agent(AgentConfig(name="box", home=tmp_path, simulate=parse_simulate("cuda:0=24", "box")))
    rs = RunState("r1", tmp_path / "r1", ["cuda:0"])
    rs.events = [{"seq": 1, "type": "log"}, {"seq": 2, "type": "run_finished"}]
    agent.runs.table[rs.run_id] = rs
    return agent, rs


async def test_it_returns_once_the_last_event_is_acked(tmp_path):
    agent, rs = _agent(tmp_path)
    agent.connected.set()
    loop = asyncio.get_running_loop()
    loop.call_later(0.05, agent.runs.ack, rs, 1)
    loop.call_later(0.10, agent.runs.ack, rs, 2)
    done = await agent.runs.await_acks(agent.connected, 30.0)
    assert done is True and rs.events == []  # True: woken by the acks, not ended by the 30 s bound


async def test_unacked_events_wait_only_for_the_bound_and_not_at_all_when_disconnected(tmp_path):
    agent, _rs = _agent(tmp_path)
    agent.connected.set()
    t0 = time.monotonic()
    bounded = await agent.runs.await_acks(agent.connected, 0.2)
    waited = time.monotonic() - t0
    agent.connected.clear()
    t1 = time.monotonic()
    gone = await agent.runs.await_acks(agent.connected, 30.0)
    took = time.monotonic() - t1
    assert bounded is False and 0.2 <= waited < 10.0
    assert gone is False and took < 10.0  # no connection: nothing to wait for
