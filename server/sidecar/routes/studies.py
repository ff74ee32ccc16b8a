"""The study routes (docs/sweeps.md): start an Optuna study, and the batch routes (routes/batches.py): list,
one study with its trials and best trial, the trials as CSV, cancel, delete. The work is
:class:`~...sweeps.study.StudyService`'s; its drivers start with the app (resuming studies a restart
interrupted) and stop before the dispatcher does."""

from __future__ import annotations

from aiohttp import web

from ....constants import STATE_DB_NAME
from ...contracts.sweeps import StudySubmit
from ...sweeps.study import StudyService
from ..keys import CONFIG_KEY, DISPATCHER_KEY, STORE_KEY
from .batches import Batch, add_batch_routes, describe_batch, errors, json_body
from .common import Body, body
from .sweeps import OBJECTIVE

STUDIES_KEY = web.AppKey("xpufleet_studies", StudyService)

routes = web.RouteTableDef()


@routes.post("/api/studies")
@body(StudySubmit)
async def submit_study(request: web.Request, sent: Body[StudySubmit]) -> web.Response:
    async with request.app[STORE_KEY].acknowledged():  # a 201 once the study and its first trials are on disk
        out = await request.app[STUDIES_KEY].create(sent.raw)
    return web.json_response(out, status=201)


STUDIES = Batch(STUDIES_KEY, "study", "/api/studies", "trials.csv")
add_batch_routes(routes, STUDIES)


# --- OpenAPI ---------------------------------------------------------------------------------------------

TRIAL = {"type": "object", "properties": {
    "number": {"type": "integer"}, "state": {"type": "string", "enum": ["running", "complete", "pruned", "failed"]},
    "value": {"type": ["number", "null"]}, "parameters": {"type": "object"}, "run_id": {"type": ["string", "null"]},
    "run_status": {"type": "string"}, "worker_id": {"type": ["string", "null"]},
    "devices": {"type": "array", "items": {"type": "string"}}, "queue_key": {"type": ["string", "null"]},
    "pruned_step": {"type": ["integer", "null"]}, "reason": {"type": ["string", "null"]},
    "started_at": {"type": ["number", "null"]}, "finished_at": {"type": ["number", "null"]},
    "progress": {"type": ["object", "null"], "description": "a running trial's latest progress event (docs/events.md)"}}}
STUDY = {"type": "object", "properties": {
    "id": {"type": "string"}, "name": {"type": "string"},
    "status": {"type": "string", "enum": ["running", "cancelling", "finished", "cancelled", "failed"]},
    "error": {"type": ["string", "null"]}, "objective": OBJECTIVE,
    "parameters": {"type": "array", "items": {"type": "string"}}, "n_trials": {"type": "integer"},
    "parallel": {"type": "integer"}, "counts": {"type": "object", "description": "trial state -> trials"},
    "best_trial": {"oneOf": [TRIAL, {"type": "null"}]}, "trials": {"type": "array", "items": TRIAL},
    "version": {"type": "integer", "description": "changes with any trial or its run: pass it back with wait"}}}

# Each route's description: the submit's in full, the batch routes' summaries (routes/batches.py).
STUDY_DESCRIPTIONS = {
    "submit": {
        "summary": "Start an Optuna study: its options and probe points (each parameter's range ends and "
                   "listed values) are checked as POST /api/runs checks a run, before anything is queued",
        "responses": {"201": {"description": "started", **json_body({"type": "object", "properties": {
            "study_id": {"type": "string"}, "status": {"type": "string"}, "n_trials": {"type": "integer"}}})},
            **errors(400, 401, 403, 413, 500, 503)}},
    "list": "Studies, newest first, with their trials' counts by state",
    "get": "One study: its trials (state, value, parameters, worker_id, devices, queue_key) and the best trial; "
           "long-poll with version and wait",
    "csv": "The trials as CSV (one column per parameter)",
    "cancel": "Cancel: no new trial; queued and running trials' runs are cancelled (they fail)",
    "delete": "Delete an ended study: its trials, its Optuna study and its runs"}


def setup(app: web.Application) -> None:
    """Create the study service, add the study routes, start and stop the drivers with the app."""
    svc = StudyService(app[STORE_KEY], app[DISPATCHER_KEY], app[CONFIG_KEY].home / STATE_DB_NAME)
    app[STUDIES_KEY] = svc
    app.add_routes(routes)
    describe_batch(app, STUDIES, STUDY, STUDY_DESCRIPTIONS)

    async def on_startup(app: web.Application) -> None:  # after the dispatcher started (cleanup_ctx first)
        await svc.start()

    async def on_shutdown(app: web.Application) -> None:  # before the dispatcher stops its runs
        await svc.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
