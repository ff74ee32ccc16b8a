"""The sweep routes (docs/sweeps.md): submit (or check) a sweep, and the batch routes (routes/batches.py):
list, one sweep with its ranked table, the table as CSV, cancel, delete. The work is
:class:`~...sweeps.driver.SweepService`'s."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ...contracts.sweeps import SweepSubmit
from ...sweeps.driver import SweepService
from ..keys import DISPATCHER_KEY, STORE_KEY
from .batches import (
    Batch,
    add_batch_routes,
    bool_param,
    describe_batch,
    errors,
    json_body,
    json_off_loop,
    query,
)
from .common import Body, body

SWEEPS_KEY = web.AppKey("xpufleet_sweeps", SweepService)

routes = web.RouteTableDef()


def dry_run_of(request: web.Request) -> bool:
    """``?dry_run=``: check and expand only."""
    return bool_param(request, "dry_run")


@routes.post("/api/sweeps")
@body(SweepSubmit, url_checks=dry_run_of)
async def submit_sweep(request: web.Request, sent: Body[SweepSubmit]) -> web.Response:
    dry_run = dry_run_of(request)
    body = sent.raw  # the spec's rules read the values as sent (sweeps/spec.py)
    svc = request.app[SWEEPS_KEY]
    # Parsing, expanding, validating and keying every child off the event loop (issue 19); then only
    # the admission decisions and the one write transaction run on it.
    draft = await asyncio.to_thread(svc.draft, body)
    result = await svc.create_off_loop(body, dry_run, draft)
    return await json_off_loop(result, status=200 if dry_run else 201)


SWEEPS = Batch(SWEEPS_KEY, "sweep", "/api/sweeps", "table.csv")
add_batch_routes(routes, SWEEPS)


# --- OpenAPI ---------------------------------------------------------------------------------------------

# The answers refer to the objective's model (a body's schema is its declared contract model's).
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

# Each route's description: the submit's in full, the batch routes' summaries (routes/batches.py).
SWEEP_DESCRIPTIONS = {
    "submit": {
        "summary": "Queue a sweep: every child is checked as POST /api/runs checks a run, before anything is "
                   "written; one rejection rejects the sweep (400 naming the variant, nothing queued)",
        "parameters": [query("dry_run", {"type": "boolean"}, "check and expand only: the variants, nothing queued")],
        "responses": {"201": {"description": "queued", **json_body({"type": "object", "properties": {
            "sweep_id": {"type": "string"}, "status": {"type": "string"}, "n_runs": {"type": "integer"},
            "run_ids": {"type": "array", "items": {"type": "string"}}}})},
            "200": {"description": "dry run: n_runs, the first 100 variants with their queue_key, and own_outputs: the savers each variant's copy moves to its run folder (docs/sweeps.md)"},
            **errors(400, 401, 403, 413, 503)}},
    "list": "Sweeps, newest first, with their children's counts by status",
    "get": "One sweep with its ranked table (parameters, metric, status, worker_id, devices, queue_key of each "
           "variant); long-poll with version and wait",
    "csv": "The ranked table as CSV (one column per parameter)",
    "cancel": "Cancel: queued children end now, running ones are stopped",
    "delete": "Delete a sweep whose children have all ended, with its children's runs"}


def setup(app: web.Application) -> None:
    """Create the sweep service and add the sweep routes."""
    app[SWEEPS_KEY] = SweepService(app[STORE_KEY], app[DISPATCHER_KEY])
    app.add_routes(routes)
    describe_batch(app, SWEEPS, SWEEP, SWEEP_DESCRIPTIONS)
