"""End to end (docs/workers.md): one-shot workers and pools with a real sidecar and real one-shot agents on loopback.

A pool's shared credential joins three one-shot agents; three runs take one instance each and every agent
exits when its run has ended; a fourth run waits (saying for what) until a fourth instance joins; departed
instances are not listed; a revoked credential is refused and shows under rejected connections.
"""

from __future__ import annotations

import time

import fleet_harness as fh
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def _pool(sc: fh.SidecarProc, name: str) -> dict:
    return sc.ok("GET", f"/api/pools/{name}")


def _wait_pool(sc: fh.SidecarProc, name: str, pred, what: str, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    pool: dict = {}
    while time.monotonic() < deadline:
        pool = _pool(sc, name)
        if pred(pool):
            return pool
        time.sleep(0.2)  # the Workers data has no push channel: bounded poll
    raise AssertionError(f"pool {name}: {what} not reached in {timeout} s: {pool}")


def test_a_pool_of_one_shot_agents_takes_one_run_each_and_they_exit(fleet):
    sc = fleet.sidecar()
    created = fleet.cli("pools", "create", "spot")
    assert created.returncode == 0, created.stderr
    assert "--one-shot" in created.stdout and "--join xfp_" in created.stdout
    token = created.stdout.split("--join ")[1].split()[0]
    # the pool exists with no instance: a run for it waits, saying for what
    early = sc.submit(fh.iris_graph(), target={"pool": "spot"})
    sc.wait_reason(early, "waiting for an instance of pool spot to join")
    # record_outputs is refused for a pool target (the agent exits when the run ends)
    code, body = sc.call("POST", "/api/runs", {"graph": fh.iris_graph(), "options": {
        "record_outputs": True, "target": {"pool": "spot"}}})
    assert code == 400 and "record_outputs is off for a one-shot pool" in body["error"]
    code, body = sc.call("POST", "/api/runs", {"graph": fh.iris_graph(), "options": {"target": {"pool": "nope"}}})
    assert code == 400 and "unknown pool 'nope'" in body["error"]

    agents = [fleet.agent("--one-shot", "--join", token, label=f"spot{i}") for i in range(3)]
    for a in agents:
        a.wait_connected()
    runs = [early] + [sc.submit(fh.iris_graph(), target={"pool": "spot"}) for _ in range(2)]
    done = [sc.wait_run(r, {"succeeded", "failed", "cancelled", "interrupted"}) for r in runs]
    assert [r["status"] for r in done] == ["succeeded"] * 3, [r["error"] for r in done]
    workers = [r["worker_id"] for r in done]
    assert len(set(workers)) == 3, workers  # one run each
    assert all(r["target"] == "pool:spot" and r["queue_key"].startswith("pool:spot/") for r in done)
    # every agent exits by itself once its run is reported
    assert [a.wait_exit(120) for a in agents] == [0, 0, 0]
    # departed instances are not listed, neither in the pool nor among the workers
    pool = _wait_pool(sc, "spot", lambda p: not p["instances"], "no instance listed")
    assert pool["idle"] == 0 and pool["busy"] == 0
    listed = sc.ok("GET", "/api/workers")
    assert not any(w["name"] in workers for w in listed["workers"])
    assert [p["name"] for p in listed["pools"]] == ["spot"]

    # a fourth run waits until a fourth instance joins
    fourth = sc.submit(fh.iris_graph(), target={"pool": "spot"})
    # its waiting reason is written when the queue loop has planned it and found no instance: still queued
    sc.wait_reason(fourth, "pool spot")
    assert sc.run(fourth)["status"] == "queued"
    late = fleet.agent("--one-shot", "--join", token, label="spot3")
    late.wait_connected()
    run = sc.wait_run(fourth, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    assert run["worker_id"] not in workers
    assert late.wait_exit(120) == 0

    # an instance that joined is listed with its pool while it is connected
    idle = fleet.agent("--one-shot", "--join", token, label="spot4")
    idle.wait_connected()
    pool = _wait_pool(sc, "spot", lambda p: p["idle"] == 1, "one idle instance")
    (inst,) = pool["instances"]
    assert inst["pool"] == "spot" and inst["one_shot"] is True and inst["auth"] == "pool"
    assert inst["selectable"] is False  # a pool instance is chosen through its pool, never by name
    code, body = sc.call("POST", "/api/runs", {"graph": fh.iris_graph(), "options": {"target": inst["name"]}})
    assert code == 400 and "one-shot instance of pool 'spot'" in body["error"]

    # revoke: the credential stops working; an agent that presents it is refused, with the reason shown
    revoked = fleet.cli("pools", "revoke", "spot")
    assert revoked.returncode == 0 and "credential revoked" in revoked.stdout, revoked.stderr
    refused = fleet.agent("--one-shot", "--join", token, "--name", "spot-refused", label="refused")
    refused.out.wait_for("the server refused this agent", timeout=60)
    rejected = [r for r in sc.rejected() if r["name"] == "spot-refused"]
    assert rejected and "unknown or revoked pool credential" in rejected[0]["reason"]
    code, body = sc.call("POST", "/api/runs", {"graph": fh.iris_graph(), "options": {"target": {"pool": "spot"}}})
    assert code == 400 and "credential was revoked" in body["error"]
    # the idle instance already joined may still take a run queued before... none is queued: remove the pool
    removed = fleet.cli("pools", "remove", "spot")
    assert removed.returncode == 0, removed.stderr
    assert idle.wait_exit(60) == 0  # told to leave
    assert sc.ok("GET", "/api/pools")["pools"] == []
