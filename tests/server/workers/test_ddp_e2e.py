"""ddp end to end (docs/ddp.md): a real sidecar, real agents with 2 simulated cards, real rank processes
(gloo on the CPU), real SIGKILLs, a real Python exception in rank 1 (the tests-only hook
``XPUFLEET_TEST_DDP_RAISE``), a real Stop, and psutil looking at the ranks' sockets while they train."""

from __future__ import annotations

import copy
import json
import os
import signal
from pathlib import Path
from typing import Any

import graph_parts as gp  # registered by tests/conftest.py
import psutil
import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.constants import ENV_TEST_DDP_RAISE

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

CARDS = ["cuda:0", "cuda:1"]
RAISE_AT_BATCH = 4


def digits_graph(epochs: int, **loop: Any) -> dict[str, Any]:
    """The ddp suites' digits graph with dropout 0.1, and an Evaluate (8) on the validation loader."""
    return {**gp.digits_ddp(epochs, dropout=0.1, **loop), "8": gp.evaluate("7", "3")}


class Fleet:
    """One sidecar and two agents with two simulated cards each (one of them with the raise hook)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        env = {"XPUFLEET_HEARTBEAT_INTERVAL_S": "1"}
        self.sidecar = harness.Sidecar(home, env).start()
        self.agents: dict[str, harness.AgentProcess] = {}
        self.start_agent("gpu2")
        self.start_agent("gpu2raise", **{ENV_TEST_DDP_RAISE: f"1:{RAISE_AT_BATCH}"})
        for name in self.agents:
            self.wait_online(name)

    @property
    def client(self) -> Any:
        return self.sidecar.client

    def start_agent(self, name: str, **env: str) -> None:
        self.agents[name] = harness.AgentProcess(self.sidecar, name, None, "--simulate", "cuda:0=24,cuda:1=24",
                                                 env=env)

    def wait_online(self, name: str, timeout: float = 120.0) -> None:
        def online() -> bool:  # 404 until the agent has said hello
            code, worker = self.client.call("GET", f"/api/workers/{name}")
            return code == 200 and worker["status"] == "Online"

        harness.wait_until(online, f"worker {name} online", timeout, every=0.2)

    def submit(self, graph: dict[str, Any], agent: str = "gpu2", devices: list[str] = CARDS) -> str:
        return self.sidecar.submit(graph, target={"worker": agent, "devices": devices})

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return self.client.events(run_id, limit=1000)["events"]

    def first(self, run_id: str, type_: str, after: int = 0, timeout: float = 180.0) -> dict[str, Any]:
        """The first event of ``type_`` past cursor ``after`` (long-polls)."""
        return harness.first_event(self.client, run_id, type_, timeout, after)

    def rank_pids(self, run_id: str) -> list[int]:
        started = self.first(run_id, "ddp_started")
        return [r["pid"] for r in started["payload"]["ranks"]]

    def training(self, run_id: str) -> None:
        """Returns once the ranks train: a progress event after ddp_started."""
        self.first(run_id, "progress", after=self.first(run_id, "ddp_started")["cursor"])

    def finished(self, run_id: str) -> dict[str, Any]:
        self.first(run_id, "run_finished")
        return self.client.run(run_id)

    def slots_used(self, agent: str) -> dict[str, int]:
        devices = self.client.request("GET", f"/api/workers/{agent}")["devices"]
        return {d["name"]: d["slots_used"] for d in devices if d["name"] in CARDS}

    def run_dir(self, agent: str, run_id: str) -> Path:
        return self.home / "agents" / agent / "runs" / run_id

    def close(self) -> None:
        for agent in self.agents.values():
            agent.stop()
        self.sidecar.stop()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    f = Fleet(tmp_path_factory.mktemp("ddp-fleet"))
    yield f
    f.close()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def listening(pid: int) -> list[Any]:
    """The listening inet sockets of ``pid`` and its children."""
    proc = psutil.Process(pid)
    found = []
    for p in [proc, *proc.children(recursive=True)]:
        found += [c.laddr for c in p.net_connections(kind="inet") if c.status == psutil.CONN_LISTEN]
    return found


def test_kill_9_of_rank_1_fails_the_run_naming_rank_1_with_every_rank_gone(fleet):
    run_id = fleet.submit(digits_graph(10**5))
    pids = fleet.rank_pids(run_id)
    fleet.training(run_id)
    # While it trains: the ranks' sockets (gloo's) listen on loopback only, and there are some.
    sockets = [addr for pid in pids for addr in listening(pid)]
    assert sockets, "gloo opened no listening socket?"
    assert all(addr.ip.startswith("127.") or addr.ip == "::1" for addr in sockets), sockets
    assert fleet.slots_used("gpu2") == {"cuda:0": 1, "cuda:1": 1}
    os.kill(pids[1], signal.SIGKILL)
    run = fleet.finished(run_id)
    # the moment the failure is reported: every rank process is gone and the cards' slots are free
    assert [p for p in pids if alive(p)] == []
    assert fleet.slots_used("gpu2") == {"cuda:0": 0, "cuda:1": 0}
    assert run["status"] == "failed"
    assert run["error"].startswith("DDP rank 1 of 2 failed: killed by SIGKILL"), run["error"]
    assert "output-rank1.log" in run["error"]
    assert run["execution_facts"]["ddp_failed_rank"] == 1


def test_an_exception_in_rank_1_fails_the_run_naming_rank_1(fleet):
    run_id = fleet.submit(digits_graph(10**5), agent="gpu2raise")
    pids = fleet.rank_pids(run_id)
    run = fleet.finished(run_id)
    assert [p for p in pids if alive(p)] == []
    assert fleet.slots_used("gpu2raise") == {"cuda:0": 0, "cuda:1": 0}
    assert run["status"] == "failed"
    assert run["error"].startswith(
        f"DDP rank 1 of 2 failed: Node 7 (XPUTrainingLoop) failed: RuntimeError: test hook {ENV_TEST_DDP_RAISE}: "
        f"rank 1 raised after batch {RAISE_AT_BATCH}"), run["error"]
    # rank 0 saw only the consequence (its peer closed the connection) or was ended by the launcher
    # first; either way the run names the cause
    facts = run["execution_facts"]
    rank0 = facts["ddp_exits"][0]
    assert rank0["ended_by_group"] or "lost contact with the other ranks" in facts["ddp_rank0_error"], facts


def _stopped_at(events: list[dict[str, Any]]) -> str:
    (line,) = [e["payload"]["message"] for e in events
               if e["type"] == "log" and "stopped at" in e["payload"].get("message", "")]
    return line.split("stopped at ", 1)[1].split(";")[0]


def test_stop_reaches_both_ranks_on_the_same_batch_and_the_checkpoint_loads_in_one_process(fleet):
    import torch

    from xpufleet.nodes.models import build_model
    from xpufleet.nodes.trainer import load_checkpoint

    run_id = fleet.submit(digits_graph(10**5))
    pids = fleet.rank_pids(run_id)
    fleet.training(run_id)
    fleet.client.cancel(run_id)
    run = fleet.finished(run_id)
    assert [p for p in pids if alive(p)] == []
    assert run["status"] == "cancelled", run["error"]
    run_dir = fleet.run_dir("gpu2", run_id)
    rank1 = [json.loads(line) for line in (run_dir / "ddp" / "events-rank1.jsonl").read_text().splitlines()]
    assert rank1[-1]["payload"]["status"] == "cancelled"
    where = _stopped_at(fleet.events(run_id))
    assert where == _stopped_at(rank1), (where, _stopped_at(rank1))  # "epoch E, batch B, step S" on both
    state = load_checkpoint(run_dir / "checkpoints" / "interrupt.pt")
    assert f"step {state['step']}" in where and state["reason"] == "interrupt"
    model = build_model(state["xpu_spec"])
    model.load_state_dict(state["model"])  # strict: no "module." keys, one process, no process group
    assert model(torch.zeros(2, 64)).shape == (2, 10)
    assert not list((run_dir / "checkpoints").glob("*rank*"))


def test_ddp_not_available_on_one_card_or_cpu_and_parallel_loops_fail_before_start(fleet):
    one = fleet.submit(digits_graph(1), devices=["cuda:0"])
    cpu = fleet.submit(digits_graph(1), devices=["cpu"])
    parallel = digits_graph(1)
    parallel["9"] = copy.deepcopy(parallel["7"])
    par = fleet.submit(parallel)
    for run_id, reason in ((one, "this run on a worker has 1 card (cuda:0)"),
                           (cpu, "this run on a worker has 0 cards (cpu)")):
        run = fleet.finished(run_id)
        assert run["status"] == "succeeded", run["error"]
        (w,) = [w for w in run["warnings"] if w["kind"] == "ddp_not_available"]
        assert reason in w["message"] and "ddp needs a queued run on a worker with two or more cards" in w["message"]
        assert run["execution_facts"]["strategy"] == "single"
    run = fleet.finished(par)
    assert run["status"] == "failed" and "parallel branches" in run["error"], run["error"]
    assert not [e for e in fleet.events(par) if e["type"] == "node_started"]


def test_the_cli_follows_a_ddp_run(fleet, tmp_path):
    path = harness.write_graph(tmp_path / "ddp.json", digits_graph(2))
    proc = fleet.sidecar.cli("run", str(path), "--target", "gpu2", "--devices", "cuda:0,cuda:1", "--seed", "1",
                             "--name", "cli-ddp", "--wait", timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (listed,) = fleet.client.runs(name="cli-ddp")["runs"]
    run = fleet.client.run(listed["id"])
    assert run["execution_facts"]["strategy"] == "ddp" and run["execution_facts"]["world_size"] == 2
    assert run["final_metrics"]["val_accuracy"] > 0.8
    assert not [w for w in run["warnings"] if w["kind"] == "ddp_not_available"]
