"""The sweep routes (docs/sweeps.md): submit (or check) a sweep, list, one sweep with its ranked table, the table
as CSV, cancel, delete. The work is :class:`~...sweeps.driver.SweepService`'s."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from aiohttp import web

from ....common.errors import ApiError
from ....common.http import float_param, int_param
from ....constants import EVENTS_LONG_POLL_MAX_S, RUNS_PAGE_MAX
from ...contracts.runs import Cancel
from ...contracts.sweeps import SweepSubmit
from ...sweeps.driver import SweepService
from .. import openapi
from ..keys import DISPATCHER_KEY, STORE_KEY
from .common import Body, body

SWEEPS_KEY = web.AppKey("xpufleet_sweeps", SweepService)


def bool_param(request: web.Request, name: str, default: bool = False) -> bool:
    raw = request.query.get(name)
    if raw is None:
        return default
    if raw.lower() in ("1", "true", "yes"):
        return True
    if raw.lower() in ("0", "false", "no"):
        return False
    raise ApiError(400, f"{name}: must be true or false, got {raw!r}")


def service(request: web.Request) -> SweepService:
    return request.app[SWEEPS_KEY]


routes = web.RouteTableDef()


def dry_run_of(request: web.Request) -> bool:
    """``?dry_run=``: check and expand only."""
    return bool_param(request, "dry_run")


@routes.post("/api/sweeps")
@body(SweepSubmit, url_checks=dry_run_of)
async def submit_sweep(request: web.Request, sent: Body[SweepSubmit]) -> web.Response:
    dry_run = dry_run_of(request)
    body = sent.raw  # the spec's rules read the values as sent (sweeps/spec.py)
    svc = service(request)
    # Parsing, expanding, validating and keying every child off the event loop (issue 19); then only
    # the admission decisions and the one write transaction run on it.
    draft = await asyncio.to_thread(svc.draft, body)
    result = await svc.create_off_loop(body, dry_run, draft)
    return await json_off_loop(result, status=200 if dry_run else 201)


async def json_off_loop(obj: Any, status: int = 200) -> web.Response:
    """A JSON answer encoded in a worker thread (a 5,000-variant table is megabytes, issue 19)."""
    text = await asyncio.to_thread(json.dumps, obj)
    return web.Response(text=text, status=status, content_type="application/json")


@routes.get("/api/sweeps")
async def list_sweeps(request: web.Request) -> web.Response:
    limit = int_param(request, "limit", 50, 1, RUNS_PAGE_MAX)
    offset = int_param(request, "offset", 0, 0)
    return web.json_response({**service(request).list(limit, offset), "limit": limit, "offset": offset})


@routes.get("/api/sweeps/{sweep_id}")
async def get_sweep(request: web.Request) -> web.Response:
    svc = service(request)
    sweep_id = request.match_info["sweep_id"]
    wait = float_param(request, "wait", 0.0, 0.0, EVENTS_LONG_POLL_MAX_S)
    version = int_param(request, "version", -1, -1)
    if wait > 0 and version >= 0:
        await svc.wait_change(sweep_id, version, wait)
    return await json_off_loop(await asyncio.to_thread(svc.get, sweep_id))


@routes.get("/api/sweeps/{sweep_id}/table.csv")
async def sweep_csv(request: web.Request) -> web.Response:
    sweep_id = request.match_info["sweep_id"]
    text = service(request).csv(sweep_id)
    return web.Response(text=text, content_type="text/csv", charset="utf-8",
                        headers={"Content-Disposition": f'attachment; filename="sweep-{sweep_id}.csv"'})


@routes.post("/api/sweeps/{sweep_id}/cancel")
@body(Cancel, required=False)
async def cancel_sweep(request: web.Request, sent: Body[Cancel]) -> web.Response:
    return await json_off_loop(await service(request).cancel(request.match_info["sweep_id"], sent.model.reason))


@routes.delete("/api/sweeps/{sweep_id}")
async def delete_sweep(request: web.Request) -> web.Response:
    return web.json_response(service(request).delete(request.match_info["sweep_id"]))


def setup(app: web.Application) -> None:
    """Create the sweep service and add the sweep routes."""
    app[SWEEPS_KEY] = SweepService(app[STORE_KEY], app[DISPATCHER_KEY])
    app.add_routes(routes)
    describe(app)


# --- OpenAPI -----------------------------------------------------------------------------------------------

ERR = {"$ref": "#/components/schemas/Error"}


def json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def errors(*codes: int) -> dict[str, Any]:
    return {str(c): {"description": "error (the message says what to fix)", **json_body(ERR)} for c in codes}


# A body's schema is its declared contract model's (routes/common.py body); the answers refer to the objective's.
OBJECTIVE = {"$ref": "#/components/schemas/Objective"}
SWEEP_ROW = {"type": "object", "properties": {
    "rank": {"type": ["integer", "null"], "description": "1 = best; null: not succeeded or no metric"},
    "variant": {"type": "integer"}, "point": {"type": "integer"}, "parameters": {"type": "object"},
    "seed": {"type": ["integer", "null"]}, "run_id": {"type": ["string", "null"]}, "name": {"type": ["string", "null"]},
    "status": {"type": "string", "description": "the run's status, or deleted"},
    "metric": {"type": ["number", "null"]}, "worker_id": {"type": ["string", "null"]},
    "devices": {"type": "array", "items": {"type": "string"}}, "queue_key": {"type": ["string", "null"]},
    "created_at": {"type": ["number", "null"]}, "started_at": {"type": ["number", "null"]},
    "finished_at": {"type": ["number", "null"]}, "error": {"type": ["string", "null"]},
    "progress": {"type": ["object", "null"], "description": "a running child's latest progress event: value, max, "
                 "text, epoch, batch, batches, loss (docs/events.md)"}}}
SWEEP = {"type": "object", "properties": {
    "id": {"type": "string"}, "name": {"type": "string"},
    "status": {"type": "string", "enum": ["queued", "running", "cancelling", "finished", "cancelled"]},
    "objective": OBJECTIVE, "parameters": {"type": "array", "items": {"type": "string"}},
    "n_runs": {"type": "integer"}, "counts": {"type": "object", "description": "run status -> variants"},
    "version": {"type": "integer", "description": "changes when any child has news: pass it back with wait"},
    "best": {"oneOf": [SWEEP_ROW, {"type": "null"}]},
    "table": {"type": "array", "items": SWEEP_ROW, "description": "ranked: best first, then the others"},
    "points": {"type": ["array", "null"], "description": "with seeds: per point mean/std/best over seeds, ranked"},
    "spec": {"type": "object", "description": "what was submitted, without the graph"},
    "cancel_requested": {"type": "boolean"}, "created_at": {"type": "number"}}}
SWEEP_ID = {"name": "sweep_id", "in": "path", "required": True, "schema": {"type": "string"}}


def query(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


def describe(app: web.Application) -> None:
    ops = {
        ("post", "/api/sweeps"): {
            "summary": "Queue a sweep: every child is checked as POST /api/runs checks a run, before anything is "
                       "written; one rejection rejects the sweep (400 naming the variant, nothing queued)",
            "parameters": [query("dry_run", {"type": "boolean"}, "check and expand only: the variants, nothing queued")],
            "responses": {"201": {"description": "queued", **json_body({"type": "object", "properties": {
                "sweep_id": {"type": "string"}, "status": {"type": "string"}, "n_runs": {"type": "integer"},
                "run_ids": {"type": "array", "items": {"type": "string"}}}})},
                "200": {"description": "dry run: n_runs, the first 100 variants with their queue_key, and own_outputs: the savers each variant's copy moves to its run folder (docs/sweeps.md)"},
                **errors(400, 401, 403, 413, 503)}},
        ("get", "/api/sweeps"): {
            "summary": "Sweeps, newest first, with their children's counts by status",
            "parameters": [query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size"),
                           query("offset", {"type": "integer", "minimum": 0}, "page start")],
            "responses": {"200": {"description": "{sweeps, total}"}, **errors(400, 401, 403)}},
        ("get", "/api/sweeps/{sweep_id}"): {
            "summary": "One sweep with its ranked table (parameters, metric, status, worker_id, devices, queue_key "
                       "of each variant); long-poll with version and wait",
            "parameters": [SWEEP_ID, query("version", {"type": "integer", "minimum": 0}, "the version last seen"),
                           query("wait", {"type": "number", "minimum": 0, "maximum": 60},
                                 "seconds to wait for a change of version")],
            "responses": {"200": {"description": "the sweep", **json_body(SWEEP)}, **errors(400, 401, 403, 404)}},
        ("get", "/api/sweeps/{sweep_id}/table.csv"): {
            "summary": "The ranked table as CSV (one column per parameter)", "parameters": [SWEEP_ID],
            "responses": {"200": {"description": "text/csv"}, **errors(401, 403, 404)}},
        ("post", "/api/sweeps/{sweep_id}/cancel"): {
            "summary": "Cancel: queued children end now, running ones are stopped", "parameters": [SWEEP_ID],
            "responses": {"200": {"description": "the sweep", **json_body(SWEEP)}, **errors(400, 401, 403, 404)}},
        ("delete", "/api/sweeps/{sweep_id}"): {
            "summary": "Delete a sweep whose children have all ended, with its children's runs",
            "parameters": [SWEEP_ID],
            "responses": {"200": {"description": "{deleted, runs_deleted}"}, **errors(401, 403, 404, 409)}},
    }
    for (method, path), op in ops.items():
        openapi.describe(app, method, path, op)
