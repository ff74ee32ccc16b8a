"""A stopping agent waits for the server's acks of its runs' last events, not for a fixed time."""

from __future__ import annotations

import asyncio
import time

from xpufleet.server.agent.agent import Agent, RunState
from xpufleet.server.agent.config import AgentConfig
from xpufleet.server.devices.simulated import parse_simulate


def _agent(tmp_path) -> tuple[Agent, RunState]:
    agent = Agent(AgentConfig(name="box", home=tmp_path, simulate=parse_simulate("cuda:0=24", "box")))
    rs = RunState("r1", tmp_path / "r1", ["cuda:0"])
    rs.events = [{"seq": 1, "type": "log"}, {"seq": 2, "type": "run_finished"}]
    agent.runs[rs.run_id] = rs
    return agent, rs


def test_it_returns_once_the_last_event_is_acked(tmp_path):
    async def scenario():
        agent, rs = _agent(tmp_path)
        agent.connected.set()
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, agent._ack, rs, 1)
        loop.call_later(0.10, agent._ack, rs, 2)
        done = await agent._await_acks(30.0)
        return done, rs.events

    done, left = asyncio.run(scenario())
    assert done is True and left == []  # True: woken by the acks, not ended by the 30 s bound


def test_unacked_events_wait_only_for_the_bound_and_not_at_all_when_disconnected(tmp_path):
    async def scenario():
        agent, _rs = _agent(tmp_path)
        agent.connected.set()
        t0 = time.monotonic()
        bounded = await agent._await_acks(0.2)
        waited = time.monotonic() - t0
        agent.connected.clear()
        t1 = time.monotonic()
        gone = await agent._await_acks(30.0)
        return bounded, waited, gone, time.monotonic() - t1

    bounded, waited, gone, took = asyncio.run(scenario())
    assert bounded is False and 0.2 <= waited < 10.0
    assert gone is False and took < 10.0  # no connection: nothing to wait for
