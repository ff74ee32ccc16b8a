"""The study routes (docs/sweeps.md): start an Optuna study, list, one study with its trials and best trial, the
trials as CSV, cancel, delete. The work is :class:`~...sweeps.study.StudyService`'s; its drivers start
with the app (resuming studies a restart interrupted) and stop before the dispatcher does."""

from __future__ import annotations

from aiohttp import web

from ....common.http import float_param, int_param
from ....constants import EVENTS_LONG_POLL_MAX_S, RUNS_PAGE_MAX, STATE_DB_NAME
from ...contracts.runs import Cancel
from ...contracts.sweeps import StudySubmit
from ...sweeps.study import StudyService
from .. import openapi
from ..keys import CONFIG_KEY, DISPATCHER_KEY, STORE_KEY
from .common import Body, body
from .sweeps import (
    OBJECTIVE,
    errors,
    json_body,
    query,
)

STUDIES_KEY = web.AppKey("xpufleet_studies", StudyService)


def service(request: web.Request) -> StudyService:
    return request.app[STUDIES_KEY]


routes = web.RouteTableDef()


@routes.post("/api/studies")
@body(StudySubmit)
async def submit_study(request: web.Request, sent: Body[StudySubmit]) -> web.Response:
    return web.json_response(await service(request).create(sent.raw), status=201)


@routes.get("/api/studies")
async def list_studies(request: web.Request) -> web.Response:
    limit = int_param(request, "limit", 50, 1, RUNS_PAGE_MAX)
    offset = int_param(request, "offset", 0, 0)
    return web.json_response({**service(request).list(limit, offset), "limit": limit, "offset": offset})


@routes.get("/api/studies/{study_id}")
async def get_study(request: web.Request) -> web.Response:
    svc = service(request)
    study_id = request.match_info["study_id"]
    wait = float_param(request, "wait", 0.0, 0.0, EVENTS_LONG_POLL_MAX_S)
    version = int_param(request, "version", -1, -1)
    if wait > 0 and version >= 0:
        await svc.wait_change(study_id, version, wait)
    return web.json_response(svc.get(study_id))


@routes.get("/api/studies/{study_id}/trials.csv")
async def study_csv(request: web.Request) -> web.Response:
    study_id = request.match_info["study_id"]
    return web.Response(text=service(request).csv(study_id), content_type="text/csv", charset="utf-8",
                        headers={"Content-Disposition": f'attachment; filename="study-{study_id}.csv"'})


@routes.post("/api/studies/{study_id}/cancel")
@body(Cancel, required=False)
async def cancel_study(request: web.Request, sent: Body[Cancel]) -> web.Response:
    return web.json_response(await service(request).cancel(request.match_info["study_id"], sent.model.reason))


@routes.delete("/api/studies/{study_id}")
async def delete_study(request: web.Request) -> web.Response:
    return web.json_response(await service(request).delete(request.match_info["study_id"]))


def setup(app: web.Application) -> None:
    """Create the study service, add the study routes, start and stop the drivers with the app."""
    svc = StudyService(app[STORE_KEY], app[DISPATCHER_KEY], app[CONFIG_KEY].home / STATE_DB_NAME)
    app[STUDIES_KEY] = svc
    app.add_routes(routes)
    describe(app)

    async def on_startup(app: web.Application) -> None:  # after the dispatcher started (cleanup_ctx first)
        await svc.start()

    async def on_shutdown(app: web.Application) -> None:  # before the dispatcher stops its runs
        await svc.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)


# --- OpenAPI -----------------------------------------------------------------------------------------------

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
STUDY_ID = {"name": "study_id", "in": "path", "required": True, "schema": {"type": "string"}}


def describe(app: web.Application) -> None:
    ops = {
        ("post", "/api/studies"): {
            "summary": "Start an Optuna study: its options and probe points (each parameter's range ends and "
                       "listed values) are checked as POST /api/runs checks a run, before anything is queued",
            "responses": {"201": {"description": "started", **json_body({"type": "object", "properties": {
                "study_id": {"type": "string"}, "status": {"type": "string"}, "n_trials": {"type": "integer"}}})},
                **errors(400, 401, 403, 413, 500, 503)}},
        ("get", "/api/studies"): {
            "summary": "Studies, newest first, with their trials' counts by state",
            "parameters": [query("limit", {"type": "integer", "minimum": 1, "maximum": 1000}, "page size"),
                           query("offset", {"type": "integer", "minimum": 0}, "page start")],
            "responses": {"200": {"description": "{studies, total}"}, **errors(400, 401, 403)}},
        ("get", "/api/studies/{study_id}"): {
            "summary": "One study: its trials (state, value, parameters, worker_id, devices, queue_key) and the "
                       "best trial; long-poll with version and wait",
            "parameters": [STUDY_ID, query("version", {"type": "integer", "minimum": 0}, "the version last seen"),
                           query("wait", {"type": "number", "minimum": 0, "maximum": 60},
                                 "seconds to wait for a change of version")],
            "responses": {"200": {"description": "the study", **json_body(STUDY)}, **errors(400, 401, 403, 404)}},
        ("get", "/api/studies/{study_id}/trials.csv"): {
            "summary": "The trials as CSV (one column per parameter)", "parameters": [STUDY_ID],
            "responses": {"200": {"description": "text/csv"}, **errors(401, 403, 404)}},
        ("post", "/api/studies/{study_id}/cancel"): {
            "summary": "Cancel: no new trial; queued and running trials' runs are cancelled (they fail)",
            "parameters": [STUDY_ID],
            "responses": {"200": {"description": "the study", **json_body(STUDY)}, **errors(400, 401, 403, 404, 409)}},
        ("delete", "/api/studies/{study_id}"): {
            "summary": "Delete an ended study: its trials, its Optuna study and its runs", "parameters": [STUDY_ID],
            "responses": {"200": {"description": "{deleted, runs_deleted}"}, **errors(401, 403, 404, 409)}},
    }
    for (method, path), op in ops.items():
        openapi.describe(app, method, path, op)
