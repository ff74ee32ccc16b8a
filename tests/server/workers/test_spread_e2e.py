"""ddp across workers end to end (docs/architecture.md "ddp across workers"): one real sidecar, two real
agents with separate XPUFLEET_HOMEs and one simulated card each (joined with join tokens, all on
127.0.0.1), a third agent with two cards for the one-worker baseline, real rank processes (gloo on the
CPU) meeting through rank 0's TCPStore, and a real kill -9 of one agent's process group and ranks."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import fleet_harness as fh  # registered by tests/server/conftest.py
import graph_parts as gp  # registered by tests/conftest.py
import psutil
import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.constants import ENV_TEST_DDP_RAISE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

def graph(epochs: int) -> dict[str, Any]:
    """The ddp suites' digits graph, checkpointing every epoch (the weights compared below)."""
    return gp.digits_ddp(epochs, checkpoint_every=1)


class Agent:
    """``xpufleet agent start --foreground`` in a session of its own (so its process group can be
    killed as one without touching the test's), with its own XPUFLEET_HOME."""

    def __init__(self, fleet: fh.Fleet, name: str, cards: str, home: Path, *args: str, **env: str) -> None:
        self.name, self.home = name, home
        home.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([*fh.CLI, "agent", "start", "--foreground", "--name", name, "--simulate", cards,
                                      *args], env=fleet.env(home, **env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        self.out = fh.LineWatcher(self.proc.stdout, fleet.tmp / f"test-agent-{name}.log")
        self.out.start()

    def descendants(self) -> set[int]:
        try:
            return {p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)
                    if p.status() != psutil.STATUS_ZOMBIE}
        except psutil.NoSuchProcess:
            return set()

    def run_dir(self, run_id: str) -> Path:
        return self.home / "agents" / self.name / "runs" / run_id

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)


class SpreadFleet:
    def __init__(self, fleet: fh.Fleet) -> None:
        self.fleet = fleet
        self.sc = fleet.sidecar()
        self.agents: dict[str, Agent] = {}

    def join(self, name: str, cards: str, **env: str) -> Agent:
        token = self.sc.ok("POST", "/api/workers/join-tokens", {"name": name}, 201)["join_token"]
        agent = Agent(self.fleet, name, cards, self.fleet.tmp / f"home-{name}", "--server", self.sc.url,
                      "--join", token, "--advertise-addr", "127.0.0.1", **env)
        self.agents[name] = agent
        self.sc.wait_worker(name, "Online", timeout=120)
        return agent

    def first(self, run_id: str, kind: str, timeout: float = 240.0) -> dict[str, Any]:
        return harness.first_event(self.sc.client, run_id, kind, timeout)

    def slots_used(self, worker: str) -> dict[str, int]:
        return {d["name"]: d["slots_used"] for d in self.sc.worker(worker)["devices"] if d["name"].startswith("cuda")}

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop()


@pytest.fixture(scope="module")
def spread_fleet(tmp_path_factory):
    base = fh.Fleet(tmp_path_factory.mktemp("spread"))
    f = SpreadFleet(base)
    try:
        f.join("a", "cuda:0=24")
        f.join("b", "cuda:0=24")
        f.join("duo", "cuda:0=24,cuda:1=24")
        yield f
    finally:
        f.close()
        base.close()


SPREAD = [{"worker": "a", "devices": ["cuda:0"]}, {"worker": "b", "devices": ["cuda:0"]}]


def final_weights(run_dir: Path) -> dict[str, Any]:
    from xpufleet.nodes.trainer import load_checkpoint

    return load_checkpoint(run_dir / "checkpoints" / "epoch_0002.pt")["model"]


def test_ddp_across_two_workers_trains_like_two_ranks_on_one_worker(spread_fleet):
    import torch

    f = spread_fleet
    wide = f.sc.submit(graph(2), seed=3, target={"spread": SPREAD})
    one = f.sc.submit(graph(2), seed=3, target={"worker": "duo", "devices": ["cuda:0", "cuda:1"]})
    runs = {r: f.sc.wait_run(r, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=600) for r in (wide, one)}
    for run in runs.values():
        assert run["status"] == "succeeded", run["error"]
    facts = runs[wide]["execution_facts"]
    assert facts["world_size"] == 2 and facts["strategy"] == "ddp", facts
    assert facts["ddp"]["rendezvous"].startswith("tcp://127.0.0.1:"), facts["ddp"]
    assert [p["worker"] for p in facts["spread_parts"]] == ["a", "b"]
    assert [p["status"] for p in facts["spread_parts"][1:]] == ["succeeded"]
    assert runs[wide]["worker_id"] == "a"
    ready = f.first(wide, "ddp_ready")["payload"]
    assert ready["store"].startswith("127.0.0.1:") and ready["world_size"] == 2
    # rank 1 ran on worker b, in its own part directory, with the interface of b's advertised address
    part = f.agents["b"].home / "agents" / "b" / "runs" / f"{wide}-part1"
    assert (part / "output-rank1.log").is_file() and (part / "ddp" / "events-rank1.jsonl").is_file()
    spread_w, one_w = final_weights(f.agents["a"].run_dir(wide)), final_weights(f.agents["duo"].run_dir(one))
    assert spread_w.keys() == one_w.keys()
    for key in one_w:
        assert torch.allclose(spread_w[key], one_w[key], atol=1e-5, rtol=0), key
    assert runs[wide]["final_metrics"]["val_accuracy"] == pytest.approx(runs[one]["final_metrics"]["val_accuracy"])
    assert f.slots_used("a") == {"cuda:0": 0} and f.slots_used("b") == {"cuda:0": 0}


def _stopped_at(events: list[dict[str, Any]]) -> str:
    (line,) = [e["payload"]["message"] for e in events
               if e["type"] == "log" and "stopped at" in e["payload"].get("message", "")]
    return line.split("stopped at ", 1)[1].split(";")[0]


def test_a_stop_reaches_the_ranks_on_both_workers_on_the_same_batch(spread_fleet):
    import json

    f = spread_fleet
    wide = f.sc.submit(graph(10**5), target={"spread": SPREAD})
    f.first(wide, "progress")
    f.sc.ok("POST", f"/api/runs/{wide}/cancel", {})
    run = f.sc.wait_run(wide, {"cancelled", "failed", "succeeded"}, timeout=300)
    assert run["status"] == "cancelled", run["error"]
    part = f.agents["b"].home / "agents" / "b" / "runs" / f"{wide}-part1"
    rank1 = [json.loads(line) for line in (part / "ddp" / "events-rank1.jsonl").read_text().splitlines()]
    assert rank1[-1]["payload"]["status"] == "cancelled"
    assert _stopped_at(f.sc.events(wide)) == _stopped_at(rank1)  # "epoch E, batch B, step S" on both workers
    assert [p["status"] for p in run["execution_facts"]["spread_parts"][1:]] == ["cancelled"]


def test_an_exception_in_the_other_worker_s_rank_fails_the_run_naming_it(spread_fleet):
    f = spread_fleet
    raiser = f.join("c", "cuda:0=24", **{ENV_TEST_DDP_RAISE: "1:4"})
    try:
        wide = f.sc.submit(graph(10**5), target={"spread": [SPREAD[0], {"worker": "c", "devices": ["cuda:0"]}]})
        run = f.sc.wait_run(wide, {"failed", "succeeded", "cancelled"}, timeout=300)
        assert run["status"] == "failed"
        assert run["error"].startswith(f"DDP rank 1 of 2 failed on worker c: Node 7 (XPUTrainingLoop) failed: "
                                       f"RuntimeError: test hook {ENV_TEST_DDP_RAISE}: rank 1 raised after batch 4"), \
            run["error"]
        assert run["error"].endswith("see output-rank1.log on worker c")
        assert f.slots_used("a") == {"cuda:0": 0} and f.slots_used("c") == {"cuda:0": 0}
    finally:
        raiser.stop()


def test_the_cli_runs_a_graph_spread_over_workers_and_the_api_refuses_what_cannot_spread(spread_fleet, tmp_path):
    import json

    f = spread_fleet
    path = tmp_path / "g.json"
    path.write_text(json.dumps(graph(1)))
    proc = f.fleet.cli("run", str(path), "--spread", "a:cuda:0", "--spread", "b:cuda:0", "--name", "cli-spread",
                       "--wait", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (listed,) = f.sc.ok("GET", "/api/runs?name=cli-spread")["runs"]
    assert f.sc.run(listed["id"])["execution_facts"]["world_size"] == 2
    bad = f.fleet.cli("run", str(path), "--spread", "a", timeout=60)
    assert bad.returncode == 2 and "write WORKER:DEVICES" in bad.stderr
    single = graph(1)
    single["7"]["inputs"]["strategy"] = "single"
    code, body = f.sc.call("POST", "/api/runs", {"graph": single, "options": {"target": {"spread": SPREAD}}})
    assert code == 400 and body["error"].startswith("options.target.spread: a run spread over workers trains with "
                                                    "ddp"), body
    code, body = f.sc.call("POST", "/api/runs", {"graph": graph(1), "options": {"target": {"spread": [
        SPREAD[0], {"worker": "b", "devices": ["cuda:5"]}]}}})
    assert code == 400 and body["error"] == ("options.target.spread[1]: worker 'b' does not offer cuda:5 (it offers "
                                             "cpu, cuda:0)"), body


def test_a_spread_run_waits_for_every_worker_s_card_at_once(spread_fleet):
    f = spread_fleet
    hold = f.sc.submit(graph(10**5), target={"worker": "b", "devices": ["cuda:0"]})
    wide = f.sc.submit(graph(2), target={"spread": SPREAD})
    behind = f.sc.submit(graph(1), target={"worker": "a", "devices": ["cuda:0"]})
    f.first(hold, "progress")
    reason = f.sc.wait_reason(wide, "holding a/cuda:0 for this device-set run")["waiting_reason"]
    assert "cuda:0 on b is busy" in reason, reason
    assert "reserved for device-set run" in f.sc.wait_reason(behind, "reserved")["waiting_reason"]
    assert f.slots_used("a") == {"cuda:0": 0}  # held for the spread run, not started by half
    f.sc.ok("POST", f"/api/runs/{hold}/cancel", {})
    assert f.sc.wait_run(wide, {"succeeded", "failed"}, timeout=600)["status"] == "succeeded"
    assert f.sc.wait_run(behind, {"succeeded", "failed"}, timeout=600)["status"] == "succeeded"


def kill_9(f: SpreadFleet, agent: Agent, rank_pid: int, run_id: str) -> dict[str, Any]:
    """kill -9 of ``agent``'s process group and of its rank (a session of its own), by PID; the run, which
    must have failed."""
    os.killpg(agent.proc.pid, signal.SIGKILL)
    fh.kill9(rank_pid)
    agent.proc.wait(timeout=30)
    run = f.sc.wait_run(run_id, {"failed", "succeeded", "cancelled", "interrupted"}, timeout=300)
    assert run["status"] == "failed", run
    return run


def test_kill_9_of_one_agent_fails_the_run_naming_that_worker_and_rank_and_leaves_nothing_on_the_other(
        spread_fleet):
    f = spread_fleet
    a, b = f.agents["a"], f.agents["b"]
    before = a.descendants()
    wide = f.sc.submit(graph(10**5), target={"spread": SPREAD})
    started = f.first(wide, "ddp_started")["payload"]
    f.first(wide, "progress")
    pids = [r["pid"] for r in started["ranks"]]
    assert len(pids) == 2 and pids[0] in a.descendants() and pids[1] in b.descendants()
    assert f.slots_used("a") == {"cuda:0": 1} and f.slots_used("b") == {"cuda:0": 1}
    run = kill_9(f, b, pids[1], wide)
    assert run["error"].startswith("DDP rank 1 of 2 failed on worker b: "), run["error"]
    assert run["execution_facts"]["ddp_failed_rank"] == 1 and run["execution_facts"]["ddp_failed_worker"] == "b"
    # nothing of the run is left on worker a: its rank and whatever the agent started for it are gone
    assert not psutil.pid_exists(pids[0]) or psutil.Process(pids[0]).status() == psutil.STATUS_ZOMBIE
    assert a.descendants() - before == set()
    assert f.slots_used("a") == {"cuda:0": 0}


def test_kill_9_of_rank_0_s_agent_fails_the_run_naming_rank_0_and_leaves_nothing_on_the_other(spread_fleet):
    f = spread_fleet
    b = f.agents["b"]
    if b.proc.poll() is not None:  # the test before killed it: it comes back with its stored credential
        b = f.agents["b"] = Agent(f.fleet, "b", "cuda:0=24", b.home, "--server", f.sc.url, "--advertise-addr",
                                  "127.0.0.1")
        f.sc.wait_worker("b", "Online", timeout=120)
    a = f.agents["a"]
    before = b.descendants()
    wide = f.sc.submit(graph(10**5), target={"spread": SPREAD})
    pids = [r["pid"] for r in f.first(wide, "ddp_started")["payload"]["ranks"]]
    f.first(wide, "progress")
    run = kill_9(f, a, pids[0], wide)
    assert run["error"].startswith("DDP rank 0 of 2 failed on worker a: worker a disconnected"), run["error"]
    assert b.descendants() - before == set()  # b reported its part once its rank had exited
    assert not psutil.pid_exists(pids[1]) or psutil.Process(pids[1]).status() == psutil.STATUS_ZOMBIE
    assert f.slots_used("b") == {"cuda:0": 0}
