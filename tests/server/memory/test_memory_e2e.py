"""End to end: memory-shared cards on a real sidecar process and real agent processes with simulated cards
(docs/memory.md, docs/architecture.md), whose free figure the test changes while the agents run (``set_simulated_free``; the agent
re-reads it at every heartbeat). Every run is a real graph (iris, an MLP) executed by a run process on the
agent, on the CPU; on a simulated card the run's tensor bytes are counted and capped to its budget (a
simulated cap: there is no CUDA allocator here), and what a simulated card reports is labelled simulated.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py
from processes import wait_until  # registered by tests/conftest.py

from xpufleet.server.devices import set_simulated_free

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]

ENV = {"XPUFLEET_HEARTBEAT_INTERVAL_S": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def graph(hidden: str = "16", epochs: int = 1) -> dict[str, Any]:
    g = copy.deepcopy(harness.IRIS_GRAPH)
    g["4"]["inputs"]["hidden"] = hidden
    g["7"]["inputs"]["epochs"] = epochs
    return g


@pytest.fixture
def fleet(tmp_path):
    home = tmp_path / "home"
    sidecar = harness.Sidecar(home, env=ENV).start()
    agents: list[harness.AgentProcess] = []

    def agent(name: str, simulate: str) -> harness.AgentProcess:
        a = harness.AgentProcess(sidecar, name, None, "--simulate", simulate)
        agents.append(a)
        a.wait_connected()
        return a

    yield sidecar, agent
    for a in agents:
        a.stop()
    sidecar.stop()


def call(sc: harness.Sidecar, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    from xpufleet.common.client import ApiError

    try:
        return 200, sc.client.request(method, path, body)
    except ApiError as exc:
        return exc.status, exc.body


def submit(sc: harness.Sidecar, g: dict[str, Any], **target: Any) -> tuple[int, Any]:
    try:
        return 201, sc.client.submit(g, {"target": target})
    except Exception as exc:  # noqa: BLE001 - the 400s are the point
        return getattr(exc, "status", 0), getattr(exc, "body", None)


def card(sc: harness.Sidecar, worker: str, device: str) -> dict[str, Any]:
    w = sc.client.request("GET", f"/api/workers/{worker}")
    return next(d for d in w["devices"] if d["name"] == device)


def free_shows(sc: harness.Sidecar, worker: str, device: str, free: float) -> None:
    wait_until(lambda: card(sc, worker, device)["free_gib"] == free, f"{worker} {device} reports {free} GiB free")


def share(sc: harness.Sidecar, worker: str, *devices: str) -> None:
    """``xpufleet workers mode WORKER DEVICE shared`` (PUT /api/workers/{name}/devices/{device}/mode)."""
    for dev in devices:
        proc = sc.cli("workers", "mode", worker, dev, "shared", timeout=60)
        assert proc.returncode == 0 and f"{dev} is shared" in proc.stdout, proc.stderr


def reason(sc: harness.Sidecar, run_id: str, text: str, timeout: float = 60.0) -> dict[str, Any]:
    return wait_until(lambda: (r := sc.client.run(run_id))["status"] == "queued"
                      and text in (r["waiting_reason"] or "") and r, f"run {run_id} waiting with {text!r}", timeout)


def test_admit_reject_wait_and_an_oom_under_a_budget_on_simulated_cards(fleet):
    sc, agent = fleet
    agent("box", "cuda:0=24,cuda:1=24")
    share(sc, "box", "cuda:0", "cuda:1")
    set_simulated_free(sc.home, "box", "cuda:0", 6.3)
    free_shows(sc, "box", "cuda:0", 6.3)
    # reject with the reason: a named worker, a budget that does not fit now
    status, body = submit(sc, graph(), worker="box", devices=["cuda:0"], memory_gib=12)
    assert status == 400
    assert body["error"] == ("needs 12.0 GiB (+0.8 GiB CUDA context), cuda:0 on box has 6.3 GiB free (set "
                             "target.wait to true to queue it until it fits)")
    # admit: a budget that fits runs, capped (simulated) to its budget, and its simulated figure is recorded
    status, body = submit(sc, graph(), worker="box", devices=["cuda:0"], memory_gib=2)
    assert status == 201, body
    admitted = body["run_id"]
    # wait, then start when memory frees: 8 GiB waits behind a card with 6.3 GiB free
    status, body = submit(sc, graph(), worker="box", devices=["cuda:0"], memory_gib=8, wait=True)
    assert status == 201, body
    waiting = body["run_id"]
    run = reason(sc, waiting, "waiting for memory: needs 8.0 GiB (+0.8 GiB CUDA context), cuda:0 on box has")
    assert run["budget"]["label"] == "8.0 GiB"
    done = sc.finish(admitted, timeout=180)
    assert done["status"] == "succeeded", done["error"]
    assert done["execution_facts"]["simulated_cap"]["budget_gib"] == 2.0
    assert done["execution_facts"]["memory_cap"]["applied"] is False  # no CUDA allocator on a simulated card
    assert done["memory_peak"]["source"] == "simulated" and "not a CUDA figure" in done["memory_peak"]["label"]
    assert done["peak_memory"]["measured"] is False and done["peak_memory"]["simulated"] is True
    assert sc.client.run(waiting)["status"] == "queued"
    set_simulated_free(sc.home, "box", "cuda:0", 20.0)  # memory frees: the next heartbeat shows it
    done = sc.finish(waiting, timeout=180)
    assert done["status"] == "succeeded" and done["worker_id"] == "box", done["error"]
    # an OOM under a budget fails that run only: two runs share cuda:1; the one over its budget fails with
    # the message, the other goes on and succeeds
    status, body = submit(sc, graph(hidden="1024,1024"), worker="box", devices=["cuda:1"], memory_gib=0.01)
    assert status == 201, body
    oom = body["run_id"]
    status, body = submit(sc, graph(epochs=3), worker="box", devices=["cuda:1"], memory_gib=1)
    assert status == 201, body
    neighbour = body["run_id"]
    failed = sc.finish(oom, timeout=180)
    assert failed["status"] == "failed"
    assert failed["error"].startswith("out of memory on cuda:1 on box under its budget of 0.01 GiB (the budget you "
                                      "typed): declare a larger options.target.memory_gib (simulated card: the "
                                      "run's tensors on the CPU went over the budget)")
    assert "simulated out of memory on cuda:1" in failed["error"]
    done = sc.finish(neighbour, timeout=180)
    assert done["status"] == "succeeded", done["error"]
    # the CLI asks the sidecar for the dialog's suggestion: this graph now has a simulated peak on box's cards
    path = sc.home / "iris.json"
    harness.write_graph(path, graph())
    proc = sc.cli("estimate", str(path), "--target", "box", "--devices", "cuda:0", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("measured: the simulated peak of run "), proc.stdout


def test_any_waits_across_two_agents_and_a_waiting_estimate_is_raised_by_a_larger_peak(fleet):
    sc, agent = fleet
    agent("a-box", "cuda:0=24,cuda:1=24")
    agent("b-box", "cuda:0=24")
    share(sc, "a-box", "cuda:0")
    share(sc, "b-box", "cuda:0")
    for worker in ("a-box", "b-box"):
        set_simulated_free(sc.home, worker, "cuda:0", 0.5)
    for worker in ("a-box", "b-box"):
        free_shows(sc, worker, "cuda:0", 0.5)
    big = graph(hidden="2048,2048")  # ~0.1 GiB of tensors: weights, Adam state, activations
    status, body = submit(sc, big, worker="any", devices=["cuda:0"], memory_gib=0.05, memory_source="estimate")
    assert status == 201, body
    waiting = body["run_id"]
    run = reason(sc, waiting, "waiting for memory")
    assert "cuda:0 on a-box has 0.50 GiB free" in run["waiting_reason"]
    assert "cuda:0 on b-box has 0.50 GiB free" in run["waiting_reason"]
    assert run["budget"]["label"] == "0.05 GiB (est.)"
    # another run of the same graph succeeds on a-box's exclusive cuda:1 with a larger (simulated) peak
    status, body = submit(sc, big, worker="a-box", devices=["cuda:1"])
    assert status == 201, body
    other = sc.finish(body["run_id"], timeout=180)
    assert other["status"] == "succeeded" and other["budget"] is None, other["error"]
    peak = other["memory_peak"]["gib"]
    assert other["memory_peak"]["source"] == "simulated" and peak > 0.05
    run = reason(sc, waiting, "raised from the estimate 0.05 GiB to")
    assert run["budget"]["from_run"] == other["id"] and run["budget"]["gib"] > peak
    assert "had a simulated peak of" in run["budget"]["reason"]
    assert run["budget"]["label"].endswith(f"(simulated peak of run {other['id'][:8]} + 20%)")
    # memory frees on b-box: the any run starts there with its raised budget
    set_simulated_free(sc.home, "b-box", "cuda:0", 20.0)
    done = sc.finish(waiting, timeout=180)
    assert done["status"] == "succeeded" and done["worker_id"] == "b-box", done["error"]
    assert done["execution_facts"]["simulated_cap"]["budget_gib"] == run["budget"]["gib"]
