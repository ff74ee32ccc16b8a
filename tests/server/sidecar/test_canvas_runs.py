"""Canvas runs on the sidecar (docs/canvas-runs.md): the two routes the plugin inside ComfyUI calls, in this
process (aiohttp's test server on loopback): a run with source canvas, listed and charted like any run;
every bad body a clear 400; a cancel recorded for the plugin; a stale run ended; a pre-source state.db."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
from typing import Any

import psutil
import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.constants import CANVAS_EVENTS_MAX, CANVAS_RUN_EVENT_BYTES_MAX
from xpufleet.server.sidecar import recovery
from xpufleet.server.sidecar.keys import STORE_KEY
from xpufleet.server.sidecar.openapi import document
from xpufleet.server.sidecar.routes import canvas as canvas_routes
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
    facts = run["execution_facts"]
    assert facts == {"comfy_pid": os.getpid(), "comfy_prompt_id": "p-1", "comfy_started": facts["comfy_started"]}
    assert facts["comfy_started"] == psutil.Process().create_time()  # who it is, beside the pid
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
    gone = {"id": client.app[STORE_KEY].create_canvas_run(graph=harness.iris_graph(1), name="old",
                                                          facts={"comfy_pid": dead.pid})}
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


# --- issue 29: a canvas run whose ComfyUI is gone or never was; cancel always ends it; a per-run cap ---

FAKE_COMFY = """
import json, os, sys, time, urllib.request
url, token, graph = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
body = json.dumps({"prompt_id": "p-x", "name": "fake", "graph": graph, "comfy_pid": os.getpid()}).encode()
req = urllib.request.Request(url + "/api/canvas/runs", data=body,
                             headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
print(json.load(urllib.request.urlopen(req, timeout=60))["id"], flush=True)
time.sleep(600)
"""


async def _fake_comfy(client: Any, auth: dict[str, str]) -> tuple[Any, str]:
    """A real process that records a canvas run with its own pid, as the plugin does, then stays silent."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FAKE_COMFY, str(client.make_url("")).rstrip("/"), auth["Authorization"][7:],
        json.dumps(harness.iris_graph(1)), stdout=asyncio.subprocess.PIPE)
    line = await asyncio.wait_for(proc.stdout.readline(), 120)
    assert line, "the stand-in ComfyUI made no run"
    return proc, line.decode().strip()


async def _await_status(client: Any, auth: dict[str, str], run_id: str, status: str, timeout: float = 120) -> dict:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        run = await (await client.get(f"/api/runs/{run_id}", headers=auth)).json()
        if run["status"] == status:
            return run
        assert asyncio.get_running_loop().time() < deadline, (status, run["status"], run["error"])
        await asyncio.sleep(0.2)  # the watch has no push channel to a test: a bounded poll


@pytest.mark.parametrize("pid_of", ["init", "dead", "other"])
async def test_a_canvas_run_naming_a_pid_that_did_not_send_it_is_refused(sidecar_client, pid_of):
    """The probe's repro: comfy_pid 1 made a run no cancel, DELETE or restart could end."""
    client, auth = await started(sidecar_client)
    if pid_of == "init":
        pid = 1
    elif pid_of == "dead":
        dead = subprocess.Popen([sys.executable, "-c", "pass"])
        dead.wait()
        pid = dead.pid
    else:  # a live process of this user that holds no connection to the sidecar
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        pid = other.pid
    try:
        resp = await client.post("/api/canvas/runs", json=new_run(pid), headers=auth)
        error = (await resp.json())["error"]
        assert resp.status == 400 and f"comfy_pid {pid}" in error, (resp.status, error)
    finally:
        if pid_of == "other":
            other.kill()
            other.wait()
    assert (await (await client.get("/api/runs", headers=auth)).json())["runs"] == []


async def test_a_canvas_run_whose_comfyui_dies_ends_interrupted_and_can_be_deleted(sidecar_client):
    client, auth = await started(sidecar_client)
    proc, run_id = await _fake_comfy(client, auth)
    assert (await client.delete(f"/api/runs/{run_id}", headers=auth)).status == 409  # running: ComfyUI lives
    proc.kill()
    await proc.wait()
    run = await _await_status(client, auth, run_id, "interrupted")
    assert run["error"] == f"ComfyUI (pid {proc.pid}) is gone; the run's end never reached the server"
    assert (await client.delete(f"/api/runs/{run_id}", headers=auth)).status == 200


async def test_a_cancel_ends_a_canvas_run_whose_comfyui_never_confirms(sidecar_client, monkeypatch):
    monkeypatch.setattr(recovery, "CANVAS_CANCEL_GRACE_S", 2.0)
    client, auth = await started(sidecar_client)
    proc, run_id = await _fake_comfy(client, auth)  # alive, silent: it never interrupts anything
    try:
        resp = await client.post(f"/api/runs/{run_id}/cancel", json={}, headers=auth)
        assert (await resp.json())["status"] == "running"  # ComfyUI is asked first
        run = await _await_status(client, auth, run_id, "cancelled")
        assert "ComfyUI did not confirm within 2 s" in run["error"]
        # the plugin's next post still tells it to interrupt the prompt, and stores nothing
        answer = await (await client.post(f"/api/canvas/runs/{run_id}/events", json={
            "events": [_metric(1, "loss", 1.0, 1)]}, headers=auth)).json()
        assert answer == {"stored": 0, "status": "cancelled", "cancel_requested": True}
        assert (await client.delete(f"/api/runs/{run_id}", headers=auth)).status == 200
    finally:
        proc.kill()
        await proc.wait()


async def test_a_cancel_of_a_canvas_run_whose_comfyui_is_gone_ends_it_at_once(sidecar_client):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    client, auth = await started(sidecar_client)
    run_id = client.app[STORE_KEY].create_canvas_run(graph=harness.iris_graph(1), name="old",
                                                     facts={"comfy_pid": dead.pid})  # a run from before the watch
    resp = await client.post(f"/api/runs/{run_id}/cancel", json={}, headers=auth)
    assert (await resp.json())["status"] == "cancelled"
    assert (await client.delete(f"/api/runs/{run_id}", headers=auth)).status == 200


async def test_a_reused_pid_is_another_process(sidecar_client):
    client, auth = await started(sidecar_client)
    created = await (await client.post("/api/canvas/runs", json=new_run(), headers=auth)).json()
    run_id = created["id"]
    facts = dict(created["execution_facts"], comfy_started=created["execution_facts"]["comfy_started"] - 100)
    store = client.app[STORE_KEY]
    with store.transaction() as db:  # as if this pid had been reused by another process since
        db.execute("UPDATE runs SET execution_facts=? WHERE id=?", (json.dumps(facts), run_id))
    await _await_status(client, auth, run_id, "interrupted")


async def test_past_its_cap_a_canvas_run_stores_nothing_more_and_ends_with_a_413(sidecar_client, tmp_path):
    """The probe's repro: 80 MiB of posted events grew state.db to 178 MiB. 1 MiB events up to 40 MiB."""
    client, auth = await started(sidecar_client)
    run_id = (await (await client.post("/api/canvas/runs", json=new_run(), headers=auth)).json())["id"]
    big = "x" * 2**20
    statuses = []
    for batch in range(10):
        events = [{"type": "log", "payload": {"node": "1", "text": big}, "ts": 1.0, "seq": batch * 4 + i + 1}
                  for i in range(4)]
        resp = await client.post(f"/api/canvas/runs/{run_id}/events", json={"events": events}, headers=auth)
        statuses.append(resp.status)
        if resp.status == 413:
            error = (await resp.json())["error"]
            break
    assert statuses == [200] * 7 + [413], statuses  # 28 MiB stored; the batch that would pass 32 MiB is refused
    assert f"{CANVAS_RUN_EVENT_BYTES_MAX // 2**20} MiB" in error and "recording stopped" in error
    run = await (await client.get(f"/api/runs/{run_id}", headers=auth)).json()
    assert run["status"] == "interrupted" and run["error"] == error
    late = await client.post(f"/api/canvas/runs/{run_id}/events", json={"events": []}, headers=auth)
    assert late.status == 409
    db = tmp_path / "home" / "state.db"
    assert db.stat().st_size + (db.with_name("state.db-wal").stat().st_size if db.with_name("state.db-wal").exists()
                                else 0) < 48 * 2**20
    assert (await client.delete(f"/api/runs/{run_id}", headers=auth)).status == 200


async def test_past_the_event_count_cap_a_canvas_run_ends_with_a_413(sidecar_client, monkeypatch):
    monkeypatch.setattr(canvas_routes, "CANVAS_RUN_EVENTS_MAX", 2500)  # the rule, at a size a test can reach fast
    client, auth = await started(sidecar_client)
    run_id = (await (await client.post("/api/canvas/runs", json=new_run(), headers=auth)).json())["id"]
    codes = []
    for batch in range(4):
        events = [_metric(batch * 1000 + i + 1, "loss", 1.0, i) for i in range(1000)]
        codes.append((await client.post(f"/api/canvas/runs/{run_id}/events", json={"events": events},
                                        headers=auth)).status)
        if codes[-1] != 200:
            break
    assert codes == [200, 200, 413]
    stored = client.app[STORE_KEY].query("SELECT COUNT(*) AS n FROM events WHERE run_id=? AND type='metric'", (run_id,))
    assert stored[0]["n"] == 2000
