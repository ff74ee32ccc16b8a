"""The sweep and study routes in this process (aiohttp's test server on loopback): statuses, bad input,
CSV, long-poll, OpenAPI. The machine offers only its CPU; a graph that can only run here is validated."""

from __future__ import annotations

import copy
import csv
import io
import json
from pathlib import Path
from typing import Any

GRAPH = json.loads((Path(__file__).resolve().parents[3] / "samples" / "mlp_digits.json").read_text())
SWEEP = {"name": "lr", "graph": GRAPH, "objective": {"metric": "val_accuracy"},
         "parameters": {"5.lr": [0.001, 0.01]}, "seeds": 2}


async def answer(resp) -> tuple[int, Any]:
    ctype = resp.headers.get("Content-Type", "")
    return resp.status, (await resp.json()) if "json" in ctype else await resp.text()


async def test_sweep_routes_answer_with_the_right_statuses(sidecar_client):
    c, config = await sidecar_client(limits="cpu=1")
    h = {"Authorization": f"Bearer {config.token}"}
    assert (await c.post("/api/sweeps", json=SWEEP)).status == 401  # mutating routes need the token
    status, plan = await answer(await c.post("/api/sweeps?dry_run=true", json=SWEEP, headers=h))
    assert status == 200 and plan["dry_run"] and plan["n_runs"] == 4
    status, bad = await answer(await c.post("/api/sweeps?dry_run=maybe", json=SWEEP, headers=h))
    assert status == 400 and bad["error"] == "dry_run: must be true or false, got 'maybe'"
    assert (await (await c.get("/api/runs", headers=h)).json())["total"] == 0
    status, created = await answer(await c.post("/api/sweeps", json=SWEEP, headers=h))
    assert status == 201 and created["n_runs"] == 4 and len(created["run_ids"]) == 4
    sid = created["sweep_id"]
    status, sweep = await answer(await c.get(f"/api/sweeps/{sid}", headers=h))
    assert status == 200 and sweep["id"] == sid and len(sweep["table"]) == 4 and sweep["objective"] == {
        "metric": "val_accuracy", "direction": "maximize"}
    assert {r["queue_key"] for r in sweep["table"]} == {"local/auto"}
    resp = await c.get(f"/api/sweeps/{sid}/table.csv", headers=h)
    assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/csv")
    assert f'filename="sweep-{sid}.csv"' in resp.headers["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(await resp.text())))
    assert len(rows) == 4 and {r["5.lr"] for r in rows} == {"0.001", "0.01"}
    status, page = await answer(await c.get("/api/sweeps?limit=1", headers=h))
    assert status == 200 and page["total"] == 1 and page["sweeps"][0]["id"] == sid and page["limit"] == 1
    for path, needle in [("/api/sweeps?limit=0", "limit: must be an integer between 1"),
                         (f"/api/sweeps/{sid}?wait=99&version=1", "wait: must be a number between 0"),
                         (f"/api/sweeps/{sid}?version=x", "version: must be an integer")]:
        status, bad = await answer(await c.get(path, headers=h))
        assert status == 400 and needle in bad["error"], (path, bad)
    status, missing = await answer(await c.get("/api/sweeps/nope", headers=h))
    assert status == 404 and missing["error"] == "no sweep 'nope'"
    assert (await c.get("/api/sweeps/nope/table.csv", headers=h)).status == 404
    assert (await c.post("/api/sweeps/nope/cancel", headers=h)).status == 404
    assert (await c.delete("/api/sweeps/nope", headers=h)).status == 404
    status, busy = await answer(await c.delete(f"/api/sweeps/{sid}", headers=h))
    assert status == 409 and "cancel it first" in busy["error"]
    status, bad = await answer(await c.post(f"/api/sweeps/{sid}/cancel", json={"why": 1}, headers=h))
    assert status == 400 and "unknown field(s) why" in bad["error"]
    status, cancelled = await answer(await c.post(f"/api/sweeps/{sid}/cancel", json={"reason": "stop"}, headers=h))
    assert status == 200 and cancelled["cancel_requested"] and cancelled["status"] in ("cancelling", "cancelled")
    for _ in range(600):  # the started child stops (a real run process on this CPU): long-poll until done
        if cancelled["status"] == "cancelled":
            break
        resp = await c.get(f"/api/sweeps/{sid}?version={cancelled['version']}&wait=5", headers=h)
        cancelled = await resp.json()
    assert cancelled["status"] == "cancelled" and set(cancelled["counts"]) <= {"cancelled", "succeeded"}
    status, gone = await answer(await c.delete(f"/api/sweeps/{sid}", headers=h))
    assert status == 200 and gone == {"deleted": sid, "runs_deleted": 4}
    assert (await (await c.get("/api/runs", headers=h)).json())["total"] == 0


async def test_bad_sweep_and_study_bodies_are_400_naming_the_field_and_write_nothing(sidecar_client):
    c, config = await sidecar_client(limits="cpu=1")
    h = {"Authorization": f"Bearer {config.token}"}
    bad_child = copy.deepcopy(SWEEP) | {"parameters": {"5.lr": [0.001, -2.0]}}
    cases = [
        ("/api/sweeps", b"not json", "the body is not valid JSON"),
        ("/api/sweeps", b"", "the body is empty"),
        ("/api/sweeps", json.dumps([1]).encode(), "the body must be an object"),
        ("/api/sweeps", json.dumps({**SWEEP, "parameters": {"5.lrr": [1.0]}}).encode(),
         "parameters['5.lrr']: node 5 (XPUOptimizer) has no input 'lrr'"),
        ("/api/sweeps", json.dumps(bad_child).encode(), "variant 2 (5.lr=-2, seed 0): graph: "),
        ("/api/sweeps", json.dumps({**SWEEP, "options": {"target": {"worker": "gpu-box"}}}).encode(),
         "unknown worker 'gpu-box'"),
        ("/api/sweeps", json.dumps({**SWEEP, "seeds": 600}).encode(), "would queue 1200 runs"),
        ("/api/studies", json.dumps({**SWEEP, "n_trials": 3}).encode(), "unknown field(s) seeds; a study has"),
        ("/api/studies", json.dumps({"graph": GRAPH, "objective": {"metric": "val_accuracy"}, "n_trials": 3,
                                     "parameters": {"5.name": ["adam", "adamax"]}}).encode(),
         "the study's runs (5.name=adamax): graph: "),
        ("/api/studies", json.dumps({"graph": GRAPH, "objective": {"metric": "val_accuracy"},
                                     "parameters": {"5.lr": {"low": 0.001, "high": 0.1}}}).encode(),
         "n_trials: the study's trial budget"),
    ]
    for path, raw, needle in cases:
        status, bad = await answer(await c.post(path, data=raw, headers={**h, "Content-Type": "application/json"}))
        assert status == 400 and needle in bad["error"], (path, raw[:60], bad)
    assert (await (await c.get("/api/runs", headers=h)).json())["total"] == 0
    assert (await (await c.get("/api/sweeps", headers=h)).json())["total"] == 0
    assert (await (await c.get("/api/studies", headers=h)).json())["total"] == 0


async def test_study_routes_and_the_openapi_document(sidecar_client):
    c, config = await sidecar_client(limits="cpu=1")
    h = {"Authorization": f"Bearer {config.token}"}
    doc = await (await c.get("/api/openapi.json")).json()
    for path, methods in {"/api/sweeps": {"get", "post"}, "/api/sweeps/{sweep_id}": {"get", "delete"},
                          "/api/sweeps/{sweep_id}/table.csv": {"get"}, "/api/sweeps/{sweep_id}/cancel": {"post"},
                          "/api/studies": {"get", "post"}, "/api/studies/{study_id}": {"get", "delete"},
                          "/api/studies/{study_id}/trials.csv": {"get"},
                          "/api/studies/{study_id}/cancel": {"post"}}.items():
        assert methods <= set(doc["paths"][path]), path
    submit = doc["paths"]["/api/sweeps"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert submit == {"$ref": "#/components/schemas/SweepSubmit"}
    schemas = doc["components"]["schemas"]  # a body's schema is its contract model's (server/contracts/)
    submit = schemas["SweepSubmit"]
    assert submit["additionalProperties"] is False and {"graph", "objective"} <= set(submit["required"])
    row = doc["paths"]["/api/sweeps/{sweep_id}"]["get"]["responses"]["200"]["content"]["application/json"]
    row = row["schema"]["properties"]["table"]["items"]["properties"]
    assert {"parameters", "metric", "status", "worker_id", "devices", "queue_key"} <= set(row)
    study = doc["paths"]["/api/studies"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    study = schemas[study["$ref"].rsplit("/", 1)[1]]
    assert {"n_trials", "parallel", "pruner", "sampler"} <= set(study["properties"])
    body = {"name": "s", "graph": GRAPH, "objective": {"metric": "val_accuracy"}, "n_trials": 1,
            "parameters": {"5.lr": {"low": 0.001, "high": 0.1, "log": True}}, "set": {"8.epochs": 1}}
    status, created = await answer(await c.post("/api/studies", json=body, headers=h))
    assert status == 201 and created["n_trials"] == 1 and created["parallel"] == 1
    sid = created["study_id"]
    status, busy = await answer(await c.delete(f"/api/studies/{sid}", headers=h))
    assert status == 409 and "cancel it first" in busy["error"]
    study = await (await c.get(f"/api/studies/{sid}", headers=h)).json()
    for _ in range(600):  # one real one-epoch trial on this CPU; long-poll until the study ends
        if study["status"] not in ("running", "cancelling"):
            break
        study = await (await c.get(f"/api/studies/{sid}?version={study['version']}&wait=5", headers=h)).json()
    assert study["status"] == "finished" and study["counts"] == {"complete": 1}, study
    assert study["best_trial"]["number"] == 0 and study["trials"][0]["run_status"] == "succeeded"
    status, again = await answer(await c.post(f"/api/studies/{sid}/cancel", headers=h))
    assert status == 409 and "already ended (finished)" in again["error"]
    resp = await c.get(f"/api/studies/{sid}/trials.csv", headers=h)
    assert resp.status == 200 and (await resp.text()).startswith("number,state,val_accuracy,5.lr,run_id")
    page = await (await c.get("/api/studies", headers=h)).json()
    assert page["total"] == 1 and page["studies"][0]["counts"] == {"complete": 1}
    status, gone = await answer(await c.delete(f"/api/studies/{sid}", headers=h))
    assert status == 200 and gone == {"deleted": sid, "runs_deleted": 1}
    assert (await c.get(f"/api/studies/{sid}", headers=h)).status == 404
