"""Canvas runs on the sidecar (docs/canvas-runs.md): the two routes the plugin inside ComfyUI calls, in this
process (aiohttp's test server on loopback): a run with source canvas, listed and charted like any run;
every bad body a clear 400; a cancel recorded for the plugin; a stale run ended; a pre-source state.db."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from typing import Any

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.constants import CANVAS_EVENTS_MAX
from xpufleet.server.sidecar.openapi import document
from xpufleet.server.sidecar.store import Store


def _metric(seq: int, name: str, value: float, step: int) -> dict[str, Any]:
    return {"type": "metric", "payload": {"node": "8", "name": name, "value": value, "step": step}, "ts": 1.0 + seq,
            "seq": seq}


async def started(sidecar_client: Any) -> tuple[Any, dict[str, str]]:
    """The in-process sidecar's client (tests/server/conftest.py) and its bearer header."""
    client, config = await sidecar_client()
    return client, {"Authorization": f"Bearer {config.token}"}


def new_run(pid: int | None = None) -> dict[str, Any]:
    return {"prompt_id": "p-1", "name": "ComfyUI prompt 3", "graph": harness.iris_graph(1), "comfy_pid": pid or os.getpid()}


async def test_a_canvas_run_is_listed_with_source_canvas_its_series_and_its_end(sidecar_client):
    client, auth = await started(sidecar_client)
    resp = await client.post("/api/canvas/runs", json=new_run(), headers=auth)
    assert resp.status == 201, await resp.text()
    run = await resp.json()
    assert (run["status"], run["source"], run["placement"], run["devices"]) == ("running", "canvas", "canvas", [])
    assert run["execution_facts"] == {"comfy_pid": os.getpid(), "comfy_prompt_id": "p-1"}
    events = [_metric(i + 1, "train_loss_batch", 2.0 - i / 10, i) for i in range(5)]
    events.append({"type": "progress", "payload": {"node": "8", "value": 5, "max": 5, "text": ""}, "ts": 9.0, "seq": 6})
    resp = await client.post(f"/api/canvas/runs/{run['id']}/events", json={"events": events}, headers=auth)
    assert await resp.json() == {"stored": 6, "status": "running", "cancel_requested": False}
    # a resent batch (the plugin's retry) is stored once
    resp = await client.post(f"/api/canvas/runs/{run['id']}/events", json={"events": events[:2]}, headers=auth)
    assert (await resp.json())["stored"] == 0
    end = {"status": "succeeded", "error": None, "final_metrics": {"train_loss_batch": 1.6, "val_accuracy": 0.97}}
    resp = await client.post(f"/api/canvas/runs/{run['id']}/events",
                             json={"events": [_metric(7, "val_accuracy", 0.97, 5)], "finished": end}, headers=auth)
    assert (await resp.json())["status"] == "succeeded"
    listing = await (await client.get("/api/runs", headers=auth)).json()
    assert [(r["id"], r["source"], r["status"]) for r in listing["runs"]] == [(run["id"], "canvas", "succeeded")]
    only = await (await client.get("/api/runs?source=canvas", headers=auth)).json()
    assert only["total"] == 1 and (await (await client.get("/api/runs?source=api", headers=auth)).json())["total"] == 0
    bad = await client.get("/api/runs?source=notebook", headers=auth)
    assert bad.status == 400 and "source: unknown 'notebook'; use api or canvas" in (await bad.json())["error"]
    one = await (await client.get(f"/api/runs/{run['id']}", headers=auth)).json()
    assert one["final_metrics"] == end["final_metrics"] and one["finished_at"] >= one["started_at"]
    assert one["graph"] == harness.iris_graph(1)
    metrics = await (await client.get(f"/api/runs/{run['id']}/metrics", headers=auth)).json()
    assert [(p["value"], p["step"], p["node"]) for p in metrics["metrics"]["train_loss_batch"]][:2] == \
        [(2.0, 0, "8"), (1.9, 1, "8")]
    assert metrics["latest"]["val_accuracy"] == 0.97
    # an ended run takes no more events
    late = await client.post(f"/api/canvas/runs/{run['id']}/events", json={"events": []}, headers=auth)
    assert late.status == 409 and "already ended (succeeded)" in (await late.json())["error"]


@pytest.mark.parametrize(("body", "message"), [
    ([], "body: must be a JSON object"),
    ({"prompt_id": "p", "graph": {}, "comfy_pid": 1, "x": 1}, "body: unknown field(s) x"),
    ({"graph": {"1": {"class_type": "XPULoss", "inputs": {}}}, "comfy_pid": 1}, "body: missing prompt_id"),
    ({"prompt_id": "", "graph": {"1": {"class_type": "XPULoss", "inputs": {}}}, "comfy_pid": 1}, "prompt_id: must be"),
    ({"prompt_id": "p", "graph": {}, "comfy_pid": 1}, "graph: must be a non-empty object"),
    ({"prompt_id": "p", "graph": {"1": {"class_type": "XPULoss", "inputs": {}}}, "comfy_pid": 0}, "comfy_pid: must be an integer >= 1"),
    ({"prompt_id": "p", "graph": {"1": {"class_type": "XPULoss", "inputs": {}}}, "comfy_pid": 1, "name": 5}, "name: must be a string"),
])
async def test_a_bad_new_canvas_run_is_a_400_naming_the_field(sidecar_client, body, message):
    client, auth = await started(sidecar_client)
    resp = await client.post("/api/canvas/runs", json=body, headers=auth)
    assert resp.status == 400
    assert message in (await resp.json())["error"]
    assert (await (await client.get("/api/runs", headers=auth)).json())["total"] == 0


@pytest.mark.parametrize(("body", "message"), [
    ({}, "body: missing events"),
    ({"events": {}}, f"events: must be a list of at most {CANVAS_EVENTS_MAX} events"),
    ({"events": [{"type": "metric", "payload": {"name": "x", "value": 1}, "ts": 1, "seq": 1}] * (CANVAS_EVENTS_MAX + 1)},
     "events: must be a list of at most"),
    ({"events": [{"type": "node_error", "payload": {}, "ts": 1, "seq": 1}]}, "events[0].type: must be one of progress"),
    ({"events": [{"type": "log", "payload": [], "ts": 1, "seq": 1}]}, "events[0].payload: must be an object"),
    ({"events": [{"type": "metric", "payload": {"value": 1}, "ts": 1, "seq": 1}]}, "events[0].payload.name"),
    ({"events": [{"type": "log", "payload": {}, "ts": "now", "seq": 1}]}, "events[0].ts: must be a finite number"),
    ({"events": [{"type": "log", "payload": {}, "ts": 1, "seq": 0}]}, "events[0].seq: must be an integer >= 1"),
    ({"events": [{"type": "log", "payload": {}, "ts": 1}]}, "events[0]: missing seq"),
    ({"events": [], "finished": {"status": "running"}}, "finished.status: must be one of cancelled"),
    ({"events": [], "finished": {"status": "failed", "error": 3}}, "finished.error: must be a string"),
    ({"events": [], "finished": {"status": "failed", "final_metrics": {"a": "high"}}}, "finished.final_metrics"),
    ({"events": [], "name": 7}, "name: must be a string"),
])
async def test_bad_canvas_events_are_a_400_naming_the_field_and_store_nothing(sidecar_client, body, message):
    client, auth = await started(sidecar_client)
    created = await (await client.post("/api/canvas/runs", json=new_run(), headers=auth)).json()
    resp = await client.post(f"/api/canvas/runs/{created['id']}/events", json=body, headers=auth)
    assert resp.status == 400
    assert message in (await resp.json())["error"]
    after = await (await client.get(f"/api/runs/{created['id']}", headers=auth)).json()
    assert (after["status"], after["cursor"]) == ("running", 1)  # only the status event of its creation


async def test_canvas_events_need_the_token_and_a_canvas_run(sidecar_client):
    client, auth = await started(sidecar_client)
    assert (await client.post("/api/canvas/runs", json=new_run())).status == 401
    queued = await (await client.post("/api/runs", json={"graph": harness.iris_graph(1)}, headers=auth)).json()
    resp = await client.post(f"/api/canvas/runs/{queued['run_id']}/events", json={"events": []}, headers=auth)
    assert resp.status == 409 and "came from POST /api/runs" in (await resp.json())["error"]
    assert (await client.post("/api/canvas/runs/nope/events", json={"events": []}, headers=auth)).status == 404
    listing = await (await client.get("/api/runs", headers=auth)).json()
    assert {r["source"] for r in listing["runs"]} == {"api"}


async def test_a_cancel_is_recorded_for_the_plugin_to_interrupt_comfyui(sidecar_client):
    client, auth = await started(sidecar_client)
    created = await (await client.post("/api/canvas/runs", json=new_run(), headers=auth)).json()
    resp = await client.post(f"/api/runs/{created['id']}/cancel", json={"reason": "enough"}, headers=auth)
    assert resp.status == 200 and (await resp.json())["status"] == "running"  # ComfyUI stops it
    answer = await (await client.post(f"/api/canvas/runs/{created['id']}/events", json={
        "events": [], "finished": {"status": "cancelled", "error": "cancelled in ComfyUI"}}, headers=auth)).json()
    assert answer == {"stored": 1, "status": "cancelled", "cancel_requested": True}
    events = await (await client.get(f"/api/runs/{created['id']}/events", headers=auth)).json()
    assert [e["type"] for e in events["events"]] == ["status", "cancel_requested", "run_finished"]


async def test_a_new_canvas_run_ends_the_stale_ones(sidecar_client):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    client, auth = await started(sidecar_client)
    gone = await (await client.post("/api/canvas/runs", json=new_run(dead.pid), headers=auth)).json()
    mine = await (await client.post("/api/canvas/runs", json=new_run(), headers=auth)).json()
    again = await (await client.post("/api/canvas/runs", json=new_run(), headers=auth)).json()
    states = {r["id"]: (r["status"], r["error"]) for r in (await (await client.get("/api/runs", headers=auth)).json())["runs"]}
    assert states[gone["id"]] == ("interrupted", f"ComfyUI (pid {dead.pid}) is gone; the run's end never reached the server")
    assert states[mine["id"]] == ("interrupted", "ComfyUI started another prompt before this run's end reached the server")
    assert states[again["id"]] == ("running", None)


async def test_the_openapi_document_lists_the_canvas_routes_and_the_source(sidecar_client):
    client, auth = await started(sidecar_client)
    doc = document(client.app)
    assert {"/api/canvas/runs", "/api/canvas/runs/{run_id}/events"} <= set(doc["paths"])
    assert doc["components"]["schemas"]["Run"]["properties"]["source"]["enum"] == ["api", "canvas"]
    params = {p["name"]: p for p in doc["paths"]["/api/runs"]["get"]["parameters"]}
    assert params["source"]["schema"]["enum"] == ["api", "canvas"]


def test_a_state_db_from_before_sources_gets_the_column_and_its_runs_are_api(tmp_path):
    path = tmp_path / "state.db"
    old = sqlite3.connect(path)
    old.execute("CREATE TABLE runs (seq INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT NOT NULL UNIQUE, name TEXT,"
                " status TEXT NOT NULL, target TEXT NOT NULL, placement TEXT, worker_id TEXT, devices TEXT NOT NULL"
                " DEFAULT '[]', requested TEXT NOT NULL DEFAULT '[]', candidates TEXT NOT NULL DEFAULT '[]', queue_key"
                " TEXT, budget_gib REAL, budget_source TEXT, graph TEXT NOT NULL, options TEXT NOT NULL, seed INTEGER,"
                " error TEXT, waiting_reason TEXT, warnings TEXT NOT NULL DEFAULT '[]', execution_facts TEXT NOT NULL"
                " DEFAULT '{}', peak_memory TEXT, final_metrics TEXT, cancel_requested INTEGER NOT NULL DEFAULT 0,"
                " pid INTEGER, run_dir TEXT, last_cursor INTEGER NOT NULL DEFAULT 0, created_at REAL NOT NULL,"
                " assigned_at REAL, started_at REAL, finished_at REAL)")
    old.execute("INSERT INTO runs(id, status, target, graph, options, created_at) VALUES"
                " ('r1', 'succeeded', 'local', '{}', '{}', 1.0)")
    old.commit()
    old.close()
    store = Store(path)
    try:
        assert store.get_run("r1")["source"] == "api"
        assert store.list_runs(source="api")[1] == 1
    finally:
        store.close()


async def test_a_restarted_sidecar_ends_the_canvas_runs_whose_comfyui_is_gone_and_keeps_the_others(sidecar_client, tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    store = Store(tmp_path / "home" / "state.db")
    gone = store.create_canvas_run(graph=harness.iris_graph(1), name="a", facts={"comfy_pid": dead.pid})
    alive = store.create_canvas_run(graph=harness.iris_graph(1), name="b", facts={"comfy_pid": os.getpid()})
    store.close()

    client, auth = await started(sidecar_client)
    states = {r["id"]: r["status"] for r in (await (await client.get("/api/runs", headers=auth)).json())["runs"]}
    assert states == {gone: "interrupted", alive: "running"}
    # the live ComfyUI goes on reporting to the new sidecar
    resp = await client.post(f"/api/canvas/runs/{alive}/events", json={
        "events": [_metric(1, "val_accuracy", 0.9, 1)], "finished": {"status": "succeeded"}}, headers=auth)
    assert (await resp.json())["status"] == "succeeded"
