"""The Workers panel's data beyond each worker's own fields (server/workers/panel_view.py): this server's own
machine as a row, running plus recently finished runs, each card's admission rule (slots or memory), a pool's
waiting runs and instance states. Pure functions, then a real in-process sidecar with a scripted agent."""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from pathlib import Path

from xpufleet.server.sidecar.store import Store
from xpufleet.server.workers.panel_view import (
    admission_rule,
    instance_state,
    recent_runs,
    run_row,
    waiting_runs,
)

_spec = importlib.util.spec_from_file_location("workers_test_registry", Path(__file__).with_name("test_registry.py"))
reg = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("workers_test_registry", reg)
_spec.loader.exec_module(reg)

GRAPH = reg.GRAPH
start_sidecar = reg.start_sidecar  # the in-process sidecar fixture (test_registry.py)


# --- pure ---------------------------------------------------------------------------------------------


def test_an_exclusive_card_admits_by_slots():
    rule = admission_rule(mode="exclusive", slots_used=1, slot_limit=1, memory=None)
    assert rule == {"by": "slots", "runs": 1, "used": 1, "limit": 1, "text": "exclusive: 1 run at a time, 1 now"}
    assert admission_rule(mode="exclusive", slots_used=0, slot_limit=2, memory=None)["text"] == \
        "exclusive: 2 runs at a time, 0 now"


def test_a_shared_card_admits_by_memory_with_the_ledgers_figures():
    memory = {"admits_by_memory": True, "reserved_gib": 1.0, "running_gib": 2.5, "context_gib": 0.75,
              "free_for_budgets_gib": 19.3, "runs": [{"id": "a"}, {"id": "b"}], "note": None}
    rule = admission_rule(mode="shared", slots_used=0, slot_limit=1, memory=memory)
    assert rule["by"] == "memory" and rule["runs"] == 2 and rule["reserved_gib"] == 3.5
    assert rule["free_for_budgets_gib"] == 19.3 and rule["context_gib"] == 0.75
    assert rule["text"] == ("shared by memory: a run starts when its budget + 0.8 GiB CUDA context fits; "
                            "19.3 GiB free for a new budget, 3.5 GiB reserved by 2 runs")


def test_a_shared_card_without_figures_or_exclusive_elsewhere_says_the_ledgers_note():
    mps = {"admits_by_memory": True, "free_for_budgets_gib": None, "runs": [], "note": "mps:0 reports no total"}
    assert admission_rule(mode="shared", slots_used=0, slot_limit=1, memory=mps)["text"] == "mps:0 reports no total"
    elsewhere = {"admits_by_memory": False, "note": "shared here, but the same card is exclusive on box2"}
    rule = admission_rule(mode="shared", slots_used=1, slot_limit=1, memory=elsewhere)
    assert rule["by"] == "slots" and rule["text"] == elsewhere["note"] and rule["limit"] == 1


def test_run_rows_and_instance_states():
    row = {"id": "r1", "name": "n", "status": "succeeded", "devices": '["cuda:0"]', "started_at": 100.0,
           "finished_at": 112.5}
    assert run_row(row, now=200.0) == {"id": "r1", "name": "n", "status": "succeeded", "devices": ["cuda:0"],
                                       "started_at": 100.0, "finished_at": 112.5, "duration_s": 12.5,
                                       "finished_age_s": 87.5}
    running = {**row, "status": "running", "devices": ["cpu"], "finished_at": None}
    assert run_row(running, now=130.0)["duration_s"] == 30.0 and run_row(running, now=130.0)["finished_age_s"] is None
    assert instance_state({"connected": True, "one_shot_taken": False}) == "idle"
    assert instance_state({"connected": True, "one_shot_taken": True}) == "running"
    assert instance_state({"connected": False, "one_shot_taken": True}) == "gone"


def test_recent_runs_are_the_providers_last_finished_newest_first(tmp_path):
    store = Store(tmp_path / "runs.db")
    try:
        ids = []
        for i in range(7):
            rid = store.create_run(graph=GRAPH, options={}, target="local", requested=[], candidates=[],
                                   queue_key="k", name=f"run{i}", now=1000.0 + i)
            store.assign(rid, provider="local", placement="local", devices=["cpu"], run_dir=None, now=1000.0 + i)
            store.mark_running(rid, now=1001.0 + i)
            store.finish(rid, "succeeded" if i % 2 else "failed", now=1010.0 + i)
            ids.append(rid)
        other = store.create_run(graph=GRAPH, options={}, target="gpu-box", requested=[], candidates=[],
                                 queue_key="k", name="elsewhere")
        store.assign(other, provider="gpu-box", placement="worker", devices=["cuda:0"], run_dir=None)
        still = store.create_run(graph=GRAPH, options={}, target="local", requested=[], candidates=[],
                                 queue_key="k", name="queued")
        rows = recent_runs(store, "local")
        assert [r["id"] for r in rows] == ids[::-1][:5]  # the newest five, other workers' and queued ones not
        assert rows[0]["duration_s"] == 9.0 and rows[0]["status"] == "failed" and rows[0]["devices"] == ["cpu"]
        assert still not in {r["id"] for r in rows} and recent_runs(store, "gpu-box") == []
        assert waiting_runs(store, "burst") == []
    finally:
        store.close()


# --- in a real sidecar ------------------------------------------------------------------------------


async def _workers(sc) -> dict:
    status, body = await sc.call("GET", "/api/workers")
    assert status == 200, body
    return body


async def test_get_workers_lists_this_server_recent_runs_card_rules_and_pool_waiting_runs(start_sidecar):
    sc = await start_sidecar()
    data = await _workers(sc)
    me = data["this_server"]
    assert me["name"] == "local" and me["this_server"] is True and me["status"] == "Online"
    assert [d["name"] for d in me["devices"]] == ["cpu"] and "local" not in {w["name"] for w in data["workers"]}
    cpu = me["devices"][0]
    assert cpu["slot_limit"] >= 1 and cpu["slots_used"] == 0 and cpu["mode"] == "exclusive"
    assert cpu["admission"]["by"] == "slots" and cpu["admission"]["limit"] == cpu["slot_limit"]
    assert me["recent_runs"] == [] and me["runs"] == [] and me["environment"]["cpu_count"] >= 1
    agent = reg.ScriptedAgent(sc, "gpu-box", capabilities=["memory_cap"])
    await agent.connect()
    status, body = await sc.call("PUT", "/api/workers/gpu-box/devices/cuda:1/mode", {"mode": "shared"})
    assert status == 200, body
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "gpu-box", "devices": ["cuda:0"]}}})
    assert status == 201, body
    run_id = body["run_id"]
    start = await agent.recv_type("start_run")
    assert start["run_id"] == run_id
    await agent.event(run_id, 1, "run_started", {"pid": 1})
    w = next(w for w in (await _workers(sc))["workers"] if w["name"] == "gpu-box")
    assert [r["id"] for r in w["runs"]] == [run_id] and w["recent_runs"] == []
    devices = {d["name"]: d for d in w["devices"]}
    assert devices["cuda:0"]["admission"] == {"by": "slots", "runs": 1, "used": 1, "limit": 1,
                                              "text": "exclusive: 1 run at a time, 1 now"}
    shared = devices["cuda:1"]["admission"]
    assert shared["by"] == "memory" and shared["runs"] == 0, shared
    assert shared["free_for_budgets_gib"] == devices["cuda:1"]["memory"]["free_for_budgets_gib"]
    assert shared["text"].startswith("shared by memory: a run starts when its budget")
    await agent.event(run_id, 2, "run_finished", {"status": "succeeded", "error": None})
    await reg._wait_status(sc, run_id, {"succeeded"})
    w = next(w for w in (await _workers(sc))["workers"] if w["name"] == "gpu-box")
    assert w["runs"] == [] and [r["id"] for r in w["recent_runs"]] == [run_id]
    assert w["recent_runs"][0]["status"] == "succeeded" and w["recent_runs"][0]["devices"] == ["cuda:0"]
    # a pool with a run waiting for an instance: listed with the run and why it waits
    status, body = await sc.call("POST", "/api/pools", {"name": "burst"})
    assert status in (200, 201), body
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {"target": {"pool": "burst"}}})
    assert status == 201, body
    pool_run = body["run_id"]
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20
    while True:  # the waiting reason is the dispatcher's next pass (bounded)
        pool = next(p for p in (await _workers(sc))["pools"] if p["name"] == "burst")
        if (pool["waiting"] and pool["waiting"][0]["waiting_reason"]) or loop.time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert [r["id"] for r in pool["waiting"]] == [pool_run] and pool["queued"] == 1
    assert "burst" in pool["waiting"][0]["waiting_reason"], pool["waiting"]
    assert pool["instances"] == []
    await agent.close()
