"""End to end: a real sidecar process and real agent processes on loopback, simulated cards (docs/architecture.md).

Every run here is a real graph (scikit-learn's iris, a small MLP) executed by the run child on the
agent, on the CPU, while scheduling, renumbering and the agent protocol work as for real cards.
Network cuts go through a loopback TCP proxy the test opens and closes; crashes are real SIGKILLs.
The processes come from tests/server/fleet_harness.py (the ``fleet`` fixture stops them, by PID).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import fleet_harness as fh  # registered by tests/server/conftest.py
import pytest
from fleet_harness import HEARTBEAT_S, LineWatcher, iris_graph
from processes import stop_process  # registered by tests/conftest.py

from xpufleet.server.agent.agent import default_name
from xpufleet.server.devices import set_simulated_free

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]


def simulated(fleet: fh.Fleet, name: str, cards: str, *args: str, env: dict[str, str] | None = None) -> fh.AgentProc:
    """An agent named ``name`` simulating ``cards`` (``cuda:0=24,...``)."""
    return fleet.agent("--name", name, "--simulate", cards, *args, env=env, label=name)


def _child_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events that came from the run child (the server adds status / cancel_requested of its own)."""
    return [e for e in events if e["type"] not in ("status", "cancel_requested")]


def _agent_events(home: Path, agent: str, run_id: str) -> list[dict[str, Any]]:
    path = home / "agents" / agent / "runs" / run_id / "events.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_agent_finished(home: Path, agent: str, run_id: str, timeout: float = 120.0) -> list[dict[str, Any]]:
    """The run child's own record on the agent (events.jsonl) once it holds run_finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evs = _agent_events(home, agent, run_id)
        if evs and evs[-1]["type"] == "run_finished":
            return evs
        time.sleep(0.1)  # a file written by another process: bounded poll
    raise AssertionError(f"run {run_id} did not finish on agent {agent}")


def _run_pid(sc: fh.SidecarProc, run_id: str, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in sc.events(run_id):
            if e["type"] == "run_started":
                return int(e["payload"]["pid"])
        sc.call("GET", f"/api/runs/{run_id}/events?cursor=0&wait=2")
    raise AssertionError(f"run {run_id} never started")


# --- the tests ----------------------------------------------------------------------------------------

def test_run_lands_on_the_named_worker_and_card_renumbered(fleet):
    sc = fleet.sidecar()
    agent = simulated(fleet, "box", "cuda:0=24,cuda:1=24,cuda:2=24")
    agent.wait_connected()
    renumbered = sc.submit(iris_graph(2, device="cuda:1"), target={"worker": "box", "devices": ["cuda:2", "cuda:0"]})
    fallback = sc.submit(iris_graph(2, device="cuda:1"), target={"worker": "box", "devices": ["cuda:1"]})
    run = sc.wait_run(renumbered, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    assert run["worker_id"] == "box" and run["devices"] == ["cuda:2", "cuda:0"]
    facts = run["execution_facts"]
    assert facts["visible_devices"] == ["cuda:0", "cuda:1"]
    assert facts["device_aliases"] == {"cuda:0": "cuda:2", "cuda:1": "cuda:0"}
    assert facts["env"]["CUDA_VISIBLE_DEVICES"] == "2,0"
    assert facts["simulated_devices"] is True and facts["placement"] == "worker"
    assert not [w for w in run["warnings"] if w.get("kind") == "device_fallback"]
    run = sc.wait_run(fallback, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    msgs = [w["message"] for w in run["warnings"] if w.get("kind") == "device_fallback"]
    assert any("is set to device cuda:1; this run has 1 card (cuda:0 = the worker's cuda:1), so when it "
               "executes, it runs on cuda:0." in m for m in msgs), run["warnings"]
    w = sc.worker("box")
    assert w["simulated"] is True and all(d["simulated"] for d in w["devices"] if d["kind"] == "cuda")
    assert w["runs"] == [] and w["status"] == "Online"
    # a test changes a simulated card's free figure while the agent runs: the next heartbeat carries it
    set_simulated_free(fleet.home, "box", "cuda:2", 5.5)
    deadline = time.monotonic() + 10 * float(HEARTBEAT_S)
    card: dict[str, Any] = {}
    while time.monotonic() < deadline:
        card = next(d for d in sc.worker("box")["devices"] if d["name"] == "cuda:2")
        if card["free_gib"] == 5.5:
            break
        time.sleep(float(HEARTBEAT_S) / 5)  # heartbeats have no push channel to the test: bounded poll
    assert card["free_gib"] == 5.5 and card["total_gib"] == 24.0 and card["simulated"] is True, card
    # the CLI shows the same (the Workers panel's fields), and drains
    shown = fleet.cli("workers")
    assert shown.returncode == 0 and "box: Online" in shown.stdout, shown.stdout + shown.stderr
    assert "cuda:2 [simulated]: 5.5/24.0 GiB free, slots 0/1, exclusive" in shown.stdout
    assert "cuda:0 [simulated]: 24.0/24.0 GiB free" in shown.stdout and "simulated cards" in shown.stdout
    listed = fleet.cli("workers", "list", "--json")
    assert json.loads(listed.stdout)["workers"][0]["devices"][3]["simulated"] is True
    drained = fleet.cli("workers", "drain", "box")
    assert drained.returncode == 0 and "box: Draining" in drained.stdout
    assert sc.worker("box")["status"] == "Draining"
    undrained = fleet.cli("workers", "undrain", "box")
    assert undrained.returncode == 0 and "worker box: Online" in undrained.stdout
    missing = fleet.cli("workers", "drain", "nobody")
    assert missing.returncode == 2 and "no worker named 'nobody'" in missing.stderr


def test_any_goes_by_name_sidecar_last_and_bad_targets_are_400(fleet):
    sc = fleet.sidecar(XPUFLEET_RUN_QUEUE_MAX_CONCURRENT="alpha/cpu=1,zeta/cpu=1")
    zeta = simulated(fleet, "zeta", "cuda:0=24")
    zeta.wait_connected()  # zeta connects first; alpha still comes first by name
    alpha = simulated(fleet, "alpha", "cuda:0=24,cuda:1=24")
    alpha.wait_connected()
    for options, needle in [
        ({"target": "nobody"}, "unknown worker 'nobody'"),
        ({"target": {"worker": "alpha", "devices": ["cuda:7"]}}, "worker 'alpha' does not offer cuda:7"),
        ({"target": {"worker": "any", "devices": ["cuda:0", "cuda:5"]}}, "runs on workers only"),
        ({"target": {"worker": "local", "devices": ["cuda:0"]}}, "this server does not offer cuda:0 (it offers cpu)"),
    ]:
        status, body = sc.call("POST", "/api/runs", {"graph": iris_graph(1), "options": options})
        assert status == 400 and needle in body["error"], (options, body)
    pair = sc.submit(iris_graph(2), target={"worker": "any", "devices": ["cuda:0", "cuda:1"]})
    single = sc.submit(iris_graph(2), target="any", device="cuda")
    cpus = [sc.submit(iris_graph(1), target="any", device="cpu") for _ in range(3)]
    got = {rid: sc.wait_run(rid, {"succeeded", "failed"}) for rid in [pair, single, *cpus]}
    assert all(r["status"] == "succeeded" for r in got.values()), {k: r["error"] for k, r in got.items()}
    assert (got[pair]["worker_id"], got[pair]["devices"]) == ("alpha", ["cuda:0", "cuda:1"])
    assert (got[single]["worker_id"], got[single]["devices"]) == ("zeta", ["cuda:0"])  # alpha's cards were busy
    # any + cpu: alpha, then zeta (each limited to 1 cpu run), then this server last
    assert [got[r]["worker_id"] for r in cpus] == ["alpha", "zeta", None]
    assert got[cpus[2]]["placement"] == "local"


def test_kill9_of_one_run_fails_that_run_only(fleet):
    sc = fleet.sidecar()
    agent = simulated(fleet, "box", "cuda:0=24,cuda:1=24")
    agent.wait_connected()
    doomed = sc.submit(iris_graph(2000), target={"worker": "box", "devices": ["cuda:0"]})
    other = sc.submit(iris_graph(15), target={"worker": "box", "devices": ["cuda:1"]})
    pid = _run_pid(sc, doomed)
    _run_pid(sc, other)
    os.kill(pid, signal.SIGKILL)
    run = sc.wait_run(doomed, {"succeeded", "failed", "interrupted"})
    assert run["status"] == "failed" and "SIGKILL" in run["error"] and "box" in run["error"]
    run = sc.wait_run(other, {"succeeded", "failed", "interrupted"})
    assert run["status"] == "succeeded", run["error"]
    assert sc.worker("box")["connected"] is True  # the agent and its connection survived
    assert agent.proc.poll() is None
    # stopping the agent stops its runs; they end interrupted and the server hears it before it goes
    last = sc.submit(iris_graph(2000), target={"worker": "box", "devices": ["cuda:0"]})
    _run_pid(sc, last)
    agent.stop()
    assert agent.proc.returncode == 0
    run = sc.wait_run(last, {"succeeded", "failed", "interrupted", "cancelled"})
    assert run["status"] == "interrupted" and "the agent on worker box was stopped" in run["error"]


def _joined_agent_through_proxy(fleet: fh.Fleet, sc: fh.SidecarProc, name: str, simulate: str, env: dict[str, str]):
    proxy = fleet.proxy(sc.port)
    status, tok = sc.call("POST", "/api/workers/join-tokens", {"name": name})
    assert status == 201
    agent = simulated(fleet, name, simulate, "--server", f"http://127.0.0.1:{proxy.port}", "--join", tok["join_token"],
                      env=env)
    agent.wait_connected()
    assert sc.worker(name)["auth"] == "credential"
    return proxy, agent


def test_cut_shorter_than_the_grace_loses_nothing(fleet):
    env = fleet.env(XPUFLEET_WORKER_RESUME_GRACE_S="120")
    sc = fleet.sidecar(XPUFLEET_WORKER_RESUME_GRACE_S="120")
    proxy, agent = _joined_agent_through_proxy(fleet, sc, "remote", "cuda:0=16", env)
    run_id = sc.submit(iris_graph(60), target={"worker": "remote", "devices": ["cuda:0"]})
    sc.wait_run(run_id, {"running"})
    proxy.cut()
    sc.wait_worker("remote", "Disconnected")
    child = _wait_agent_finished(fleet.home, "remote", run_id)  # the run finished while cut off
    assert child[-1]["payload"]["status"] == "succeeded"
    assert sc.run(run_id)["status"] == "running"  # the server holds the run for the grace
    mark = len(agent.out.lines)
    proxy.restore()
    agent.wait_connected(start=mark)
    run = sc.wait_run(run_id, {"succeeded", "failed", "interrupted"})
    assert run["status"] == "succeeded", run["error"]
    stored = _child_events(sc.events(run_id))
    assert [(e["type"], e["payload"]) for e in stored] == [(e["type"], e["payload"]) for e in child][:-1] + [
        (stored[-1]["type"], stored[-1]["payload"])]
    assert len(stored) == len(child) and stored[-1]["type"] == "run_finished"
    metrics = [e for e in stored if e["type"] == "metric"]
    assert len(metrics) == sum(1 for e in child if e["type"] == "metric") > 0


def test_cut_longer_than_the_grace_interrupts(fleet):
    sc = fleet.sidecar(XPUFLEET_WORKER_RESUME_GRACE_S="3")
    # the remote agent's environment does not set the grace: it follows the server's (sent in welcome)
    proxy, agent = _joined_agent_through_proxy(fleet, sc, "remote", "cuda:0=16", fleet.env())
    run_id = sc.submit(iris_graph(5000), target={"worker": "remote", "devices": ["cuda:0"]})
    sc.wait_run(run_id, {"running"})
    proxy.cut()
    run = sc.wait_run(run_id, {"succeeded", "failed", "interrupted", "cancelled"}, timeout=60)
    assert run["status"] == "interrupted" and "XPUFLEET_WORKER_RESUME_GRACE_S" in run["error"]
    child = _wait_agent_finished(fleet.home, "remote", run_id, timeout=60)  # the agent stopped it too
    assert child[-1]["payload"]["status"] == "interrupted"
    mark = len(agent.out.lines)
    proxy.restore()
    agent.wait_connected(start=mark)
    w = sc.wait_worker("remote", "Online")
    assert w["runs"] == [] and sc.run(run_id)["status"] == "interrupted"


def test_agent_start_with_zero_arguments_next_to_the_sidecar_then_status_and_stop(fleet):
    sc = fleet.sidecar()
    name = default_name()
    start = fleet.cli("agent", "start")
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        assert f"worker agent {name} connected to {sc.url}" in start.stdout
        w = sc.wait_worker(name, "Online", timeout=10)
        assert w["auth"] == "session" and w["version_match"] is True and w["simulated"] is False
        assert w["devices"][0]["name"] == "cpu" and not any(d["simulated"] for d in w["devices"])
        again = fleet.cli("agent", "start")
        assert again.returncode == 0 and "already running" in again.stdout
        status = fleet.cli("agent", "status")
        assert status.returncode == 0 and f"{name}: connected" in status.stdout, status.stdout
        assert "[simulated cards]" not in status.stdout
    finally:
        stop = fleet.cli("agent", "stop")
    assert stop.returncode == 0 and f"worker agent {name} stopped" in stop.stdout, stop.stdout + stop.stderr
    status = fleet.cli("agent", "status")
    assert status.returncode == 1 and f"{name}: not running" in status.stdout
    assert sc.wait_worker(name, "Disconnected", timeout=10)["connected"] is False


def test_sidecar_kill9_mid_run_is_taken_over(fleet):
    sc = fleet.sidecar()
    # zero arguments on the sidecar's machine: address and session token from the runtime file
    start = fleet.cli("agent", "start", "--name", "box", "--simulate", "cuda:0=8")
    assert start.returncode == 0 and "connected to" in start.stdout, start.stdout + start.stderr
    try:
        status = fleet.cli("agent", "status")
        assert status.returncode == 0 and "box: connected" in status.stdout and "[simulated cards]" in status.stdout
        sc.wait_worker("box", "Online", timeout=10)
        run_id = sc.submit(iris_graph(40), target={"worker": "box", "devices": ["cuda:0"]})
        sc.wait_run(run_id, {"running"})
        sc.kill9()
        sc.start()  # same home, new port, new session token: the agent finds it through runtime.json
        run = sc.wait_run(run_id, {"succeeded", "failed", "interrupted"})
        assert run["status"] == "succeeded", run["error"]
        child = _agent_events(fleet.home, "box", run_id)
        stored = _child_events(sc.events(run_id))
        assert len(stored) == len(child) and [e["type"] for e in stored] == [e["type"] for e in child]
        w = sc.wait_worker("box", "Online")
        assert w["connected_since_start"] is True
    finally:
        stop = fleet.cli("agent", "stop", "--name", "box")
    assert stop.returncode == 0 and "stopped" in stop.stdout


def test_revoked_and_wrong_credentials_are_refused(fleet, tmp_path):
    sc = fleet.sidecar()
    shown = fleet.cli("workers", "join-token", "--name", "remote")
    assert shown.returncode == 0 and "on the worker machine, run:" in shown.stdout, shown.stdout + shown.stderr
    assert f"xpufleet agent start --server {sc.url} --join " in shown.stdout and "--name remote" in shown.stdout
    tok = json.loads(fleet.cli("workers", "join-token", "--name", "remote", "--json").stdout)
    remote_home = tmp_path / "remote-machine"  # a remote worker keeps its own state
    agent = simulated(fleet, "remote", "cuda:0=16", "--server", sc.url, "--join", tok["join_token"],
                      env=fleet.env(remote_home))
    agent.wait_connected()
    cred_file = remote_home / "agents" / "remote.credential.json"
    assert oct(cred_file.stat().st_mode & 0o777) == "0o600"
    joined = json.loads(cred_file.read_text())["credential"]
    # reissue: the connected worker gets (and stores) a new credential
    reissued = fleet.cli("workers", "reissue", "remote")
    assert reissued.returncode == 0 and "new credential delivered" in reissued.stdout, reissued.stdout
    cred = joined
    deadline = time.monotonic() + 30
    while cred == joined and time.monotonic() < deadline:
        time.sleep(0.1)  # a file another process writes: bounded poll
        cred = json.loads(cred_file.read_text())["credential"]
    assert cred != joined
    # another machine presenting a wrong credential for this name: refused, under "Rejected connections"
    other_home = tmp_path / "impostor-machine"
    (other_home / "agents").mkdir(parents=True)
    forged = other_home / "agents" / "remote.credential.json"
    forged.write_text(json.dumps({"server": sc.url, "credential": "not-the-credential"}))
    impostor = simulated(fleet, "remote", "cuda:0=16", "--server", sc.url, env=fleet.env(other_home))
    impostor.out.wait_for("refused this agent")
    impostor.stop()
    rejected = sc.call("GET", "/api/workers/rejected")[1]["rejected"]
    assert rejected[0]["name"] == "remote" and "bad credential" in rejected[0]["reason"]
    w = sc.worker("remote")
    assert w["last_rejection"]["reason"].startswith("bad credential") and w["connected"] is True
    # remove: the credential is revoked and the agent is told so (it exits)
    removed = fleet.cli("workers", "remove", "remote")
    assert removed.returncode == 0 and "worker remote removed (0 waiting run(s) failed" in removed.stdout
    assert agent.proc.wait(timeout=60) == 0 and agent.out.count("was removed") >= 1
    forged.write_text(json.dumps({"server": sc.url, "credential": cred}))  # the revoked credential
    again = simulated(fleet, "remote", "cuda:0=16", "--server", sc.url, env=fleet.env(other_home))
    again.out.wait_for("refused this agent")
    again.stop()
    assert "no credential is valid" in sc.call("GET", "/api/workers/rejected")[1]["rejected"][0]["reason"]
    assert sc.call("GET", "/api/workers/remote")[0] == 404
    # an agent of another xpufleet version: refused at every retry, listed once with its version
    old_agent = subprocess.Popen(
        [sys.executable, "-c", "import sys, xpufleet.constants as c; c.VERSION = '0.0.9'; "
         "from xpufleet.server.cli.main import main; sys.exit(main(sys.argv[1:]))",
         "agent", "start", "--foreground", "--name", "old-box"],
        env=fleet.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out = LineWatcher(old_agent.stdout, fleet.home / "test-agent-old-box.log")
    out.start()
    try:
        first = out.wait_for("refused this agent: version mismatch")
        out.wait_for("refused this agent: version mismatch", first + 1)  # it retried
    finally:
        stop_process(old_agent)
    rows = [r for r in sc.call("GET", "/api/workers/rejected")[1]["rejected"] if r["name"] == "old-box"]
    assert len(rows) == 1 and rows[0]["version"] == "0.0.9", rows
    assert rows[0]["reason"].startswith("version mismatch: the agent runs xpufleet 0.0.9, the server ")
    assert sc.call("GET", "/api/workers/old-box")[0] == 404  # refused agents get no worker card
    shown = fleet.cli("workers", "rejected")
    assert shown.returncode == 0 and "old-box from 127.0.0.1: version mismatch" in shown.stdout, shown.stdout


def test_two_agents_simulating_one_uuid_are_one_card(fleet):
    sc = fleet.sidecar(XPUFLEET_RUN_QUEUE_MAX_CONCURRENT="a-box/cuda:0=3,b-box/cuda:0=2")
    a = simulated(fleet, "a-box", "cuda:0=24@GPU-shared-card")
    b = simulated(fleet, "b-box", "cuda:0=24@GPU-shared-card")
    a.wait_connected()
    b.wait_connected()
    wa, wb = sc.worker("a-box"), sc.worker("b-box")
    card_a = next(d for d in wa["devices"] if d["name"] == "cuda:0")
    card_b = next(d for d in wb["devices"] if d["name"] == "cuda:0")
    assert card_a["slot_limit"] == card_b["slot_limit"] == 2 and card_a["limit_from"] == "b-box"
    assert card_a["same_card_as"] == [{"provider": "b-box", "device": "cuda:0"}]
    assert any("for cuda:0 on a-box is lowered to 2" in w for w in wa["warnings"])
    runs = [sc.submit(iris_graph(3000), target={"worker": "a-box", "devices": ["cuda:0"]}) for _ in range(2)]
    third = sc.submit(iris_graph(1), target={"worker": "b-box", "devices": ["cuda:0"]})
    for rid in runs:
        sc.wait_run(rid, {"running"})
    waiting = sc.run(third)
    assert waiting["status"] == "queued" and "busy (2 of 2 slots used" in waiting["waiting_reason"]
    card = next(d for d in sc.worker("b-box")["devices"] if d["name"] == "cuda:0")
    assert card["slots_used"] == 2
    for rid in runs:
        assert sc.call("POST", f"/api/runs/{rid}/cancel")[0] == 200
    assert sc.wait_run(third, {"succeeded", "failed"})["status"] == "succeeded"
    assert {sc.run(r)["status"] for r in runs} == {"cancelled"}
