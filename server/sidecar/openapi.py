"""The OpenAPI 3.1 description of the sidecar's HTTP API, served at ``GET /api/openapi.json`` (docs/limits.md).

Generated: every request body's schema is the contract model its route's handler declares and validates
with (routes/common.py ``body``; :func:`bodies` reads the declarations off the routes), the run answers
are models too, and the status and
source enums come from ``constants.py``. Routes describe their summaries, parameters and answers with
:func:`describe` (other modules too: workers, predictor); any route of the app without a description still
appears, with its path parameters, so the document lists every route the server answers. The tests read
this document and fuzz every route with bad bodies.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import BaseModel

from ...constants import EVENTS_PAGE_MAX, MAX_PATH_CHARS, RUN_SOURCES, RUN_STATUSES, RUNS_PAGE_MAX, VERSION
from ..contracts import runs
from ..contracts.base import component_schemas
from ..contracts.runs import EXAMPLE_GRAPH  # noqa: F401 (the documented example, named here since issue 9)

OPENAPI_KEY = web.AppKey("xpufleet_openapi", dict)

ERROR = {"$ref": "#/components/schemas/Error"}


def _json(schema: dict[str, Any]) -> dict[str, Any]:
    return {"content": {"application/json": {"schema": schema}}}


def _errors(*codes: int) -> dict[str, Any]:
    text = {400: "bad input (the message names the field)", 401: "missing token", 403: "wrong token or Host",
            404: "no such run", 409: "conflict with the run's status", 413: "body too large",
            503: "the server is stopping"}
    return {str(c): {"description": text.get(c, "error"), **_json(ERROR)} for c in codes}


BODY_ATTR = "xpufleet_body"  # the BodySpec a route's handler carries (routes/common.py declares it)


@dataclass(frozen=True)
class BodySpec:
    """What a route's body is: its contract ``model`` (None: the route takes no body), whether it must be
    sent (an optional body left out is validated as ``{}``), and whether the route passes it on unread (a
    service's request, which its program validates: the model documents it)."""

    model: type[BaseModel] | None
    required: bool = True
    passed_on: bool = False


def body_spec(handler: Any) -> BodySpec | None:
    """The body a route's handler declared (None: nothing declared: a GET, a DELETE, a WebSocket)."""
    return getattr(handler, BODY_ATTR, None)


# The answers described by a model (the run routes'); the other answers are described by their routes.
ANSWERS: list[type[BaseModel]] = [runs.Run, runs.RunQueued, runs.Event, runs.Node]

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["error"],
    "properties": {"error": {"type": "string", "description": "what is wrong and what to fix"},
                   "node_errors": {"type": "object", "description": "ComfyUI-shaped, for graph errors"}},
}
SERVICE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["name", "state", "version", "spec", "units", "update"],
    "properties": {
        "name": {"type": "string"},
        "state": {"type": "string", "enum": ["ready", "updating", "degraded", "starting", "failed", "stopped"]},
        "version": {"type": "integer"}, "spec": {"$ref": "#/components/schemas/ServiceSpec"},
        "units": {"type": "array", "items": {"type": "object", "properties": {
            "id": {"type": "string"}, "state": {"type": "string"}, "generation": {"type": "integer"},
            "failed_reason": {"type": ["string", "null"]},
            "instances": {"type": "array", "items": {"type": "object", "properties": {
                "rank": {"type": "integer"}, "worker": {"type": ["string", "null"]},
                "device": {"type": ["string", "null"]}, "pid": {"type": ["integer", "null"]},
                "generation": {"type": "integer"}, "state": {"type": "string"},
                "restarts": {"type": "integer"}, "last_exit": {"type": ["string", "null"]}}}}}}},
        "update": {"type": ["object", "null"]},
    },
}


@functools.cache
def schemas(body_models: tuple[type[BaseModel], ...]) -> dict[str, Any]:
    """The document's ``components/schemas``: the error, every body model and the models they use, the
    run answers, the service (made once per set of models: the routes never change once added)."""
    return {"Error": ERROR_SCHEMA, **component_schemas([*body_models, *ANSWERS]), "Service": SERVICE_SCHEMA}


RUN_ID = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1},
          "description": "a run id (GET /api/runs lists them)"}


def _q(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": False, "schema": schema, "description": description}


# (method, path) -> operation; the run routes of this module's app.
RUN_OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("get", "/api/health"): {
        "summary": "Liveness (no token needed)", "security": [],
        "responses": {"200": {"description": "ok", **_json({"type": "object"})}},
    },
    ("get", "/api/status"): {
        "summary": "Server status: version, pid, run counts, providers and slots",
        "responses": {"200": {"description": "status", **_json({"type": "object"})}, **_errors(401, 403)},
    },
    ("get", "/api/openapi.json"): {
        "summary": "This document (no token needed)", "security": [],
        "responses": {"200": {"description": "OpenAPI 3.1", **_json({"type": "object"})}},
    },
    ("post", "/api/runs"): {
        "summary": "Queue a run",
        "responses": {"201": {"description": "queued", **_json({"$ref": "#/components/schemas/RunQueued"})},
                      **_errors(400, 401, 403, 413, 503)},
    },
    ("get", "/api/runs"): {
        "summary": "List runs, newest first",
        "parameters": [
            _q("status", {"type": "string", "pattern": f"^(({'|'.join(RUN_STATUSES)}),?)*$"},
               "comma-separated statuses"),
            _q("name", {"type": "string"}, "substring of the run name"),
            _q("worker", {"type": "string"}, "worker name, or local"),
            _q("source", {"type": "string", "enum": list(RUN_SOURCES)},
               "where runs came from: api (POST /api/runs) or canvas (ComfyUI's own Run)"),
            _q("limit", {"type": "integer", "minimum": 1, "maximum": RUNS_PAGE_MAX, "default": 50}, "page size"),
            _q("offset", {"type": "integer", "minimum": 0, "default": 0}, "page start"),
        ],
        "responses": {"200": {"description": "runs", **_json({"type": "object", "properties": {
            "runs": {"type": "array", "items": {"$ref": "#/components/schemas/Run"}},
            "total": {"type": "integer"}}})}, **_errors(400, 401, 403)},
    },
    ("get", "/api/runs/{run_id}"): {
        "summary": "One run (with its graph)", "parameters": [RUN_ID],
        "responses": {"200": {"description": "the run", **_json({"$ref": "#/components/schemas/Run"})},
                      **_errors(401, 403, 404)},
    },
    ("delete", "/api/runs/{run_id}"): {
        "summary": "Delete a finished run (record, events, run directory)", "parameters": [RUN_ID],
        "responses": {"200": {"description": "deleted", **_json({"type": "object"})}, **_errors(401, 403, 404, 409)},
    },
    ("post", "/api/runs/{run_id}/cancel"): {
        "summary": "Cancel: a queued run ends now; a started run stops cooperatively (interrupt checkpoint)",
        "parameters": [RUN_ID],
        "responses": {"200": {"description": "the run", **_json({"$ref": "#/components/schemas/Run"})},
                      **_errors(400, 401, 403, 404, 409)},
    },
    ("get", "/api/runs/{run_id}/events"): {
        "summary": "Events after a cursor (gapless per run); long-poll with wait",
        "parameters": [RUN_ID,
                       _q("cursor", {"type": "integer", "minimum": 0, "default": 0}, "last cursor seen"),
                       _q("wait", {"type": "number", "minimum": 0, "maximum": 60, "default": 0},
                          "seconds to wait for an event when none is there"),
                       _q("limit", {"type": "integer", "minimum": 1, "maximum": EVENTS_PAGE_MAX, "default": 500},
                          "max events"),
                       _q("type", {"type": "string"}, "comma-separated event types")],
        "responses": {"200": {"description": "events", **_json({"type": "object", "properties": {
            "events": {"type": "array", "items": {"$ref": "#/components/schemas/Event"}},
            "cursor": {"type": "integer"}, "status": {"type": "string"}, "done": {"type": "boolean"}}})},
            **_errors(400, 401, 403, 404)},
    },
    ("get", "/api/runs/{run_id}/events/stream"): {
        "summary": "Live event stream (Server-Sent Events; id = cursor; Last-Event-ID resumes)",
        "parameters": [RUN_ID, _q("cursor", {"type": "integer", "minimum": 0}, "start after this cursor")],
        "responses": {"200": {"description": "text/event-stream"}, **_errors(400, 401, 403, 404)},
    },
    ("get", "/api/runs/{run_id}/metrics"): {
        "summary": "Metric series by name, and the final values", "parameters": [RUN_ID],
        "responses": {"200": {"description": "metrics", **_json({"type": "object", "properties": {
            "run_id": {"type": "string"}, "status": {"type": "string"},
            "metrics": {"type": "object", "description": "name -> [{value, cursor, ts, step?, epoch?, node?}]"},
            "latest": {"type": "object"}, "final": {"type": ["object", "null"]},
            "truncated": {"type": "boolean", "description": "series stop after 100,000 points (the CSV has all)"},
        }})}, **_errors(401, 403, 404)},
    },
    ("get", "/api/runs/{run_id}/metrics.csv"): {
        "summary": "Metric points as CSV (cursor, ts, node, name, value, step, epoch)", "parameters": [RUN_ID],
        "responses": {"200": {"description": "text/csv"}, **_errors(401, 403, 404)},
    },
    ("get", "/api/runs/{run_id}/artifacts"): {
        "summary": "Files of the run (checkpoints, saved models, TensorBoard, logs)", "parameters": [RUN_ID],
        "responses": {"200": {"description": "artifacts", **_json({"type": "object"})}, **_errors(401, 403, 404)},
    },
    ("get", "/api/runs/{run_id}/artifacts/{path}"): {
        "summary": "Download one file inside the run directory",
        "parameters": [RUN_ID, {"name": "path", "in": "path", "required": True,
                                "schema": {"type": "string", "minLength": 1, "maxLength": MAX_PATH_CHARS},
                                "description": "relative to the run directory, as GET .../artifacts lists it",
                                "example": "spec.json"}],
        "responses": {"200": {"description": "the file"}, **_errors(400, 401, 403, 404)},
    },
    ("get", "/api/runs/{run_id}/logs"): {
        "summary": "The run's output log (stdout and stderr of its process)",
        "parameters": [RUN_ID, _q("offset", {"type": "integer", "minimum": 0}, "byte offset"),
                       _q("limit", {"type": "integer", "minimum": 1}, "bytes"),
                       _q("tail", {"type": "integer", "minimum": 1}, "last N bytes"),
                       _q("format", {"type": "string", "enum": ["json", "text"]}, "answer shape")],
        "responses": {"200": {"description": "log text"}, **_errors(400, 401, 403, 404)},
    },
}

SERVICE = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_SERVICE_ANSWER = _json({"$ref": "#/components/schemas/Service"})

# The service routes (server/sidecar/routes/services.py registers them).
SERVICE_OPERATIONS: dict[tuple[str, str], dict[str, Any]] = {
    ("post", "/api/services"): {
        "summary": "Create a service: replicas units of unit.size instances, one worker card each",
        "responses": {"201": {"description": "the service", **_SERVICE_ANSWER}, **_errors(400, 401, 403, 409, 413)},
    },
    ("get", "/api/services"): {
        "summary": "Every service with its units and instances",
        "responses": {"200": {"description": "services", **_json({"type": "object", "properties": {
            "services": {"type": "array", "items": {"$ref": "#/components/schemas/Service"}}}})},
            **_errors(401, 403)},
    },
    ("get", "/api/services/{name}"): {
        "summary": "One service: units, and per instance rank, worker, card, pid, generation, state, restarts, "
                   "last exit cause", "parameters": [SERVICE],
        "responses": {"200": {"description": "the service", **_SERVICE_ANSWER}, **_errors(401, 403, 404)},
    },
    ("put", "/api/services/{name}"): {
        "summary": "Rolling update to a new spec: whole units, make-before-break, one at a time; rolled back when "
                   "a new unit never becomes ready", "parameters": [SERVICE],
        "responses": {"202": {"description": "the update started", **_SERVICE_ANSWER},
                      "200": {"description": "the spec is unchanged", **_SERVICE_ANSWER},
                      **_errors(400, 401, 403, 404, 409)},
    },
    ("delete", "/api/services/{name}"): {
        "summary": "Delete a service: every unit drains its in-flight requests and stops", "parameters": [SERVICE],
        "responses": {"200": {"description": "deleted", **_json({"type": "object"})}, **_errors(401, 403, 404)},
    },
    ("post", "/api/services/{name}/infer"): {
        "summary": "One request, sent to rank 0 of a ready unit (least outstanding requests); it waits at most "
                   "routing.wait_s for a ready unit", "parameters": [SERVICE],
        "responses": {"200": {"description": "rank 0's answer (headers X-Xpufleet-Unit, X-Xpufleet-Generation)"},
                      **_errors(400, 401, 403, 404, 503, 504)},
    },
    ("get", "/api/services/{name}/export"): {
        "summary": "The service as a Kubernetes LeaderWorkerSet manifest (YAML)",
        "parameters": [SERVICE, _q("format", {"type": "string", "enum": ["lws"]}, "manifest format"),
                       _q("image", {"type": "string"}, "the container image"),
                       _q("namespace", {"type": "string"}, "the Kubernetes namespace")],
        "responses": {"200": {"description": "application/yaml"}, **_errors(400, 401, 403, 404)},
    },
}


def setup(app: web.Application) -> None:
    """Register this module's descriptions on ``app``."""
    app[OPENAPI_KEY] = {k: dict(v) for k, v in RUN_OPERATIONS.items()}


def describe(app: web.Application, method: str, path: str, operation: dict[str, Any]) -> None:
    """Add or replace the description of one route (``path`` in OpenAPI form: ``/api/x/{name}``)."""
    app[OPENAPI_KEY][(method.lower(), path)] = operation


_PARAM_RE = re.compile(r"\{([^}:]+)(?::[^}]*)?\}")


def _operations(app: web.Application) -> Iterator[tuple[str, str, str, Any]]:
    """(method, path in OpenAPI form, the path as registered, handler) of every route of ``app``."""
    for route in app.router.routes():
        method = route.method.lower()
        if method in ("head", "*", "options"):
            continue
        info = route.resource.get_info() if route.resource is not None else {}
        raw = info.get("formatter") or info.get("path")
        if raw:
            yield method, _PARAM_RE.sub(lambda m: "{" + m.group(1) + "}", raw), raw, route.handler


def bodies(app: web.Application) -> dict[tuple[str, str], BodySpec]:
    """The body each route of ``app`` declared (routes/common.py ``body``, ``no_body``), by (method, path):
    read from the handlers themselves, so the document shows the model the handler validates with."""
    out: dict[tuple[str, str], BodySpec] = {}
    for method, path, _raw, handler in _operations(app):
        spec = body_spec(handler)
        if spec is not None:
            out[(method, path)] = spec
    return out


def document(app: web.Application) -> dict[str, Any]:
    """The OpenAPI document for every route of ``app``."""
    described: dict[tuple[str, str], dict[str, Any]] = dict(app.get(OPENAPI_KEY, {}))
    for method, path, raw, _handler in _operations(app):
        if (method, path) in described:
            continue  # (its body, if any, is set below from its handler's declaration)
        params = [{"name": n, "in": "path", "required": True, "schema": {"type": "string"}}
                  for n in _PARAM_RE.findall(raw)]
        op: dict[str, Any] = {"summary": f"{method.upper()} {path}", "responses": {"200": {"description": "ok"}}}
        if params:
            op["parameters"] = params
        described[(method, path)] = op
    declared = bodies(app)
    for key, spec in declared.items():
        if key in described and spec.model is not None:
            described[key] = {**described[key], "requestBody": {
                "required": spec.required, **_json({"$ref": f"#/components/schemas/{spec.model.__name__}"})}}
    paths: dict[str, dict[str, Any]] = {}
    for (method, path), op in sorted(described.items()):
        paths.setdefault(path, {})[method] = op
    models = tuple(dict.fromkeys(spec.model for spec in declared.values() if spec.model is not None))
    return {
        "openapi": "3.1.0",
        "info": {"title": "XPU Fleet sidecar API", "version": VERSION,
                 "description": "Runs, workers, predictor. Errors are {\"error\": message} with a 4xx status."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                           "description": "the session token from $XPUFLEET_HOME/runtime.json"}},
            "schemas": schemas(models),
        },
        "paths": paths,
    }
