"""Issue 19, end to end: no request does heavy work on the event loop. A real sidecar on loopback; while
each heavy request runs (and half a second after its answer, when a run it queued starts), a thread sends
``GET /api/health`` every 20 ms. No health check may wait more than ``harness.health_bound`` of its own
unloaded median, measured in the same test (20x + 1 s: see sidecar_harness.HEALTH_STALL_FACTOR).

Graphs of 1,000 and 5,000 nodes: a valid chain of TrainingLoops (each trains the previous one's model)
and the probe's ring. Before the fix the loop stalled 0.6 to 60 s on these, and over 120 s on the
5,000-node chain (bench/bench_loop_stalls.py has the table).
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

SIZES = (1000, 5000)
SHAPES = {"chain": harness.loops_chain, "ring": harness.loops_ring}
SWEPT = {"chain": ("5.lr", [0.1, 0.01, 0.001, 0.0001]), "ring": ("1.epochs", [1, 2, 3, 4])}
CANCELLED_VARIANTS = 5000
AFTER_S = 0.5  # sampled after the answer too: a queued run starts then


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    sc = harness.Sidecar(tmp_path_factory.mktemp("stalls-home"), env={"XPUFLEET_HEARTBEAT_INTERVAL_S": "1"}).start()
    yield sc
    sc.stop()


def sampled(sc: harness.Sidecar, path: str, obj: Any) -> tuple[int, Any, list[float], float]:
    """POST ``obj`` to ``path`` while health is sampled: (status, answer, health waits, their bound)."""
    api = harness.Api(sc)
    bound = harness.health_bound(harness.unloaded_health(api))
    body = json.dumps(obj).encode()
    sampler = harness.Sampler(lambda: api.call("GET", "/api/health", timeout=300)[2], every=0.02)
    sampler.start()
    try:
        status, answer, _ = api.call("POST", path, body, timeout=300)
        time.sleep(AFTER_S)
    finally:
        samples = sampler.stop()
    waits = [t for _, t in samples]
    assert waits and all(isinstance(t, float) for t in waits), samples
    return status, answer, waits, bound


def no_stall(waits: list[float], bound: float, what: str = "") -> None:
    assert max(waits) < bound, f"{what}: a health check waited {max(waits):.3f} s (bound {bound:.3f} s): {waits}"


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_submitting_a_run_never_stalls_the_loop(sidecar, shape, n):
    status, answer, waits, bound = sampled(sidecar, "/api/runs", {"graph": SHAPES[shape](n)})
    if shape == "chain":
        assert status == 201, answer
        harness.Api(sidecar).post(f"/api/runs/{answer['run_id']}/cancel", {})
    else:
        assert status == 400 and answer["validation"]["error"]["extra_info"]["errors_total"] >= 8 * n, answer
    no_stall(waits, bound)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_a_sweeps_dry_run_never_stalls_the_loop(sidecar, shape, n):
    path, values = SWEPT[shape]
    body = {"name": "stalls", "graph": SHAPES[shape](n), "objective": {"metric": "val_accuracy"},
            "parameters": {path: values}, "options": {"target": "local"}}
    status, answer, waits, bound = sampled(sidecar, "/api/sweeps?dry_run=true", body)
    if shape == "chain":
        assert status == 200 and answer["dry_run"] is True and answer["n_runs"] == 4, answer
    else:
        assert status == 400 and answer["error"].startswith("variant 0 (1.epochs=1): graph:"), answer
    no_stall(waits, bound)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_an_estimate_never_stalls_the_loop_and_a_huge_graph_is_too_large_to_estimate(sidecar, shape, n):
    status, answer, waits, bound = sampled(sidecar, "/api/estimates", {"graph": SHAPES[shape](n)})
    assert status == 200 and answer["source"] == "none" and answer["rough"] is True, answer
    assert answer["reasons"][0].startswith("too large to estimate: the graph runs a model in "), answer
    assert answer["graph_key"] is not None
    no_stall(waits, bound)


def test_queueing_and_cancelling_a_sweep_of_5000_variants_never_stalls_the_loop(sidecar):
    """A worker that connected once and then stopped: its runs are accepted and stay queued."""
    agent = harness.AgentProcess(sidecar, "box", None, "--simulate", "cuda:0=24")
    try:
        api = harness.Api(sidecar)
        harness.wait_until(lambda: (w := api.call("GET", "/api/workers/box")[1]) and w.get("status") == "Online",
                           "worker box online", 90)
    finally:
        agent.stop()
    body = {"name": "cancel-me", "graph": harness.iris_graph(1), "objective": {"metric": "val_accuracy"},
            "parameters": {"5.lr": {"low": 1e-5, "high": 0.3, "log": True, "steps": CANCELLED_VARIANTS}},
            "max_runs": CANCELLED_VARIANTS, "options": {"target": {"worker": "box", "devices": ["cuda:0"]}}}
    status, created, waits, bound = sampled(sidecar, "/api/sweeps", body)
    assert status == 201 and created["n_runs"] == CANCELLED_VARIANTS, created
    no_stall(waits, bound, "queueing")
    queued = sidecar.client.request("GET", "/api/runs", params={"status": "queued", "limit": 1})["total"]
    assert queued == CANCELLED_VARIANTS
    status, answer, waits, bound = sampled(sidecar, f"/api/sweeps/{created['sweep_id']}/cancel", {})
    assert status == 200 and answer["counts"] == {"cancelled": CANCELLED_VARIANTS}, answer["counts"]
    assert sidecar.client.request("GET", "/api/runs", params={"status": "queued", "limit": 1})["total"] == 0
    no_stall(waits, bound, "cancelling")
