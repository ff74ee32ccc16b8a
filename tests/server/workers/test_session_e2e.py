"""Agent identity (server/workers/session.py), end to end: two real agent processes with two homes
and the same --name. The second is refused with a reason shown under rejected connections while the
first is connected and heartbeating, so the two never knock each other off; it takes the name when
the first stops, or when the first falls silent past the heartbeat deadline (a frozen process)."""

from __future__ import annotations

import os
import shutil
import signal
import time

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HEARTBEAT_S = 1.0  # late (silent past the deadline) after 3 s


def worker(sc: harness.Sidecar, name: str) -> dict:
    """The worker as the API shows it ({} until it first connects)."""
    found = [w for w in sc.client.request("GET", "/api/workers")["workers"] if w["name"] == name]
    return found[0] if found else {"status": None}


def rejections(sc: harness.Sidecar, name: str) -> list[dict]:
    return [r for r in sc.client.request("GET", "/api/workers/rejected")["rejected"] if r["name"] == name]


def test_a_second_agent_under_an_online_name_is_refused_and_never_flaps(tmp_path):
    sc = harness.Sidecar(tmp_path / "home1", env={"XPUFLEET_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_S)}).start()
    agents: list[harness.AgentProcess] = []
    try:
        first = harness.AgentProcess(sc, "w1")
        agents.append(first)
        harness.wait_until(lambda: worker(sc, "w1")["status"] == "Online", "w1 online")
        home2 = tmp_path / "home2"  # a second home on this machine, finding the same sidecar
        home2.mkdir(mode=0o700)
        shutil.copy(sc.home / "runtime.json", home2 / "runtime.json")
        second = harness.AgentProcess(sc, "w1", home2, "--devices", "cpu")
        agents.append(second)
        (refused,) = harness.wait_until(lambda: rejections(sc, "w1"), "the second agent refused")
        assert refused["reason"].startswith("worker name 'w1' is in use: agent pid ")
        assert "is connected and heartbeating; start this agent with another --name" in refused["reason"]
        harness.wait_until(lambda: second.state().get("state") == "rejected", "the refusal reaching the agent")
        assert second.state()["reason"] == refused["reason"]
        # Several heartbeats and retries later: the first never lost the name, nothing flapped.
        seen = set()
        deadline = time.monotonic() + 6 * HEARTBEAT_S
        while time.monotonic() < deadline:
            w = worker(sc, "w1")
            seen.add((w["status"], len(w["devices"]), w["environment"].get("hostname")))
            time.sleep(0.1)  # sampling the status: there is no push channel
        assert len(seen) == 1 and next(iter(seen))[0] == "Online", seen
        assert first.text().count("connected to") == 1 and "connected to" not in second.text()
        assert len(rejections(sc, "w1")) == 1  # a retrying agent is listed once, at its latest attempt
        assert worker(sc, "w1")["last_rejection"]["reason"] == refused["reason"]
        listed = sc.cli("workers", "rejected", check=True).stdout
        assert "w1 from 127.0.0.1: worker name 'w1' is in use" in listed

        # A frozen first agent (SIGSTOP: its socket stays open, its heartbeats stop) loses the name
        # once it has been silent past the deadline; the second one's next retry takes it.
        os.kill(first.proc.pid, signal.SIGSTOP)
        try:
            harness.wait_until(lambda: "connected to" in second.text(), "the second agent connected", 60)
        finally:
            os.kill(first.proc.pid, signal.SIGCONT)
        w = harness.wait_until(lambda: (lambda w: w if w["status"] == "Online" else None)(worker(sc, "w1")),
                               "w1 online again")
        assert [d["name"] for d in w["devices"]] == ["cpu"]  # the second agent's offer
        # The thawed first agent is now the one refused, and the second keeps the name.
        harness.wait_until(lambda: first.state().get("state") == "rejected", "the first agent refused", 60)
        assert first.state()["reason"].startswith("worker name 'w1' is in use")
        assert second.text().count("connected to") == 1

        # When the holder stops, the other takes the name on its next retry (no silence needed).
        second.stop()
        harness.wait_until(lambda: first.text().count("connected to") == 2, "the first agent back", 60)
        assert worker(sc, "w1")["status"] == "Online"
    finally:
        for a in agents:
            a.stop()
        sc.stop()
