"""Canvas runs (docs/canvas-runs.md): a graph run by ComfyUI's own Run button executes in ComfyUI's process;
the plugin there records it here, so it is listed by ``GET /api/runs`` (source ``canvas``) with its events
and metric series like any run.

- ``POST /api/canvas/runs`` ``{"prompt_id", "name", "graph", "comfy_pid"}``: a running run (201).
- ``POST /api/canvas/runs/{run_id}/events`` ``{"events": [{"type", "payload", "ts", "seq"}], "finished"?}``:
  what its nodes reported (``seq`` makes a resent batch count once); ``finished`` ``{"status", "error",
  "final_metrics"}`` ends it. The answer says whether a cancel was asked (``cancel_requested``): the
  plugin then interrupts ComfyUI's prompt, as ComfyUI's own Cancel does.

Only the plugin calls these, with the session token it reads from the runtime file, as the proxy does.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from ....common.errors import ApiError
from ....common.http import read_json
from ....common.runtime_file import pid_alive
from ....constants import CANVAS_EVENT_TYPES, CANVAS_EVENTS_MAX, MAX_RUN_NAME_CHARS, TERMINAL_STATUSES
from ...contracts.misc import ERROR_CHARS, PROMPT_ID_CHARS
from ...run.events import NewEvent
from ...run.requests import check_graph_shape
from .. import openapi
from ..keys import STORE_KEY
from .common import dispatcher_of, public_run

_PROMPT_ID_CHARS = PROMPT_ID_CHARS  # the contract's (server/contracts/misc.py)
_ERROR_CHARS = ERROR_CHARS


def _object(body: Any, fields: set[str], required: set[str], what: str) -> Mapping[str, Any]:
    if not isinstance(body, Mapping):
        raise ApiError(400, f"{what}: must be a JSON object with {', '.join(sorted(fields))}")
    unknown = sorted(set(body) - fields)
    if unknown:
        raise ApiError(400, f"{what}: unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(fields))}")
    missing = sorted(required - set(body))
    if missing:
        raise ApiError(400, f"{what}: missing {', '.join(missing)}")
    return body


def _int(value: Any, path: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low or value >= 2**63:
        raise ApiError(400, f"{path}: must be an integer >= {low}")
    return value


def _number(value: Any, path: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ApiError(400, f"{path}: must be a finite number")
    return float(value)


def parse_new_run(body: Any) -> dict[str, Any]:
    """The body of ``POST /api/canvas/runs``; ApiError 400 naming the field."""
    body = _object(body, {"prompt_id", "name", "graph", "comfy_pid"}, {"prompt_id", "graph", "comfy_pid"}, "body")
    prompt_id = body["prompt_id"]
    if not isinstance(prompt_id, str) or not 0 < len(prompt_id) <= _PROMPT_ID_CHARS:
        raise ApiError(400, f"prompt_id: must be ComfyUI's prompt id, a string of 1-{_PROMPT_ID_CHARS} characters")
    name = parse_name(body)
    check_graph_shape(body["graph"])  # RequestError: 400 (413 over the node limit) naming what is wrong
    return {"prompt_id": prompt_id, "name": name, "graph": dict(body["graph"]),
            "comfy_pid": _int(body["comfy_pid"], "comfy_pid", 1)}


def parse_name(body: Mapping[str, Any]) -> str | None:
    """``name`` of a body: None when absent; ApiError 400 when not a string of at most MAX_RUN_NAME_CHARS."""
    name = body.get("name")
    if name is not None and (not isinstance(name, str) or len(name) > MAX_RUN_NAME_CHARS):
        raise ApiError(400, f"name: must be a string of at most {MAX_RUN_NAME_CHARS} characters (or null)")
    return (name or "").strip() or None


def parse_events(body: Any) -> tuple[list[NewEvent], dict[str, Any] | None]:
    """The body of ``POST /api/canvas/runs/{id}/events``: the events and the end (or None); a ``name``
    renames the run (the workflow's, said by the page after the run was made)."""
    body = _object(body, {"events", "finished", "name"}, {"events"}, "body")
    raw = body["events"]
    if not isinstance(raw, list) or len(raw) > CANVAS_EVENTS_MAX:
        raise ApiError(400, f"events: must be a list of at most {CANVAS_EVENTS_MAX} events")
    events = []
    for i, ev in enumerate(raw):
        path = f"events[{i}]"
        ev = _object(ev, {"type", "payload", "ts", "seq"}, {"type", "payload", "ts", "seq"}, path)
        if ev["type"] not in CANVAS_EVENT_TYPES:
            raise ApiError(400, f"{path}.type: must be one of {', '.join(CANVAS_EVENT_TYPES)}, got {ev['type']!r}")
        if not isinstance(ev["payload"], Mapping):
            raise ApiError(400, f"{path}.payload: must be an object")
        if ev["type"] == "metric" and not isinstance(ev["payload"].get("name"), str):
            raise ApiError(400, f"{path}.payload.name: a metric names its series (a string)")
        events.append(NewEvent(ev["type"], dict(ev["payload"]), _number(ev["ts"], f"{path}.ts"),
                               _int(ev["seq"], f"{path}.seq", 1)))
    finished = body.get("finished")
    if finished is None:
        return events, None
    finished = _object(finished, {"status", "error", "final_metrics"}, {"status"}, "finished")
    if finished["status"] not in TERMINAL_STATUSES:
        raise ApiError(400, f"finished.status: must be one of {', '.join(sorted(TERMINAL_STATUSES))}")
    error = finished.get("error")
    if error is not None and (not isinstance(error, str) or len(error) > _ERROR_CHARS):
        raise ApiError(400, f"finished.error: must be a string of at most {_ERROR_CHARS} characters (or null)")
    metrics = finished.get("final_metrics") or {}
    if not isinstance(metrics, Mapping) or any(
            not isinstance(k, str) or (v is not None and (isinstance(v, bool) or not isinstance(v, int | float)))
            for k, v in metrics.items()):
        raise ApiError(400, "finished.final_metrics: must map metric names to numbers (or null)")
    return events, {"status": finished["status"], "error": error, "final_metrics": dict(metrics)}


def _end_stale(request: web.Request, comfy_pid: int) -> None:
    """End the running canvas runs whose ComfyUI is gone, or whose ComfyUI started another prompt (one
    ComfyUI runs one prompt at a time, so that run's end was lost): they would stay running forever."""
    store, d = request.app[STORE_KEY], dispatcher_of(request)
    running, _ = store.list_runs(statuses=["running"], source="canvas", limit=1000)
    for run in running:
        pid = run["execution_facts"].get("comfy_pid")
        if pid == comfy_pid or not pid_alive(pid):
            why = ("ComfyUI started another prompt before this run's end reached the server" if pid == comfy_pid
                   else f"ComfyUI (pid {pid}) is gone; the run's end never reached the server")
            if store.finish(run["id"], "interrupted", error=why):
                d.hub.notify(run["id"])


async def create(request: web.Request) -> web.Response:
    new = parse_new_run(await read_json(request))
    _end_stale(request, new["comfy_pid"])
    facts = {"comfy_pid": new["comfy_pid"], "comfy_prompt_id": new["prompt_id"]}
    store = request.app[STORE_KEY]
    run_id = store.create_canvas_run(graph=new["graph"], name=new["name"], facts=facts)
    return web.json_response(public_run(store.get_run(run_id)), status=201)


async def add_events(request: web.Request) -> web.Response:
    body = await read_json(request)
    events, finished = parse_events(body)
    store, d = request.app[STORE_KEY], dispatcher_of(request)
    run_id = request.match_info["run_id"]
    run = store.get_run(run_id)
    if run is None:
        raise ApiError(404, f"no run {run_id!r}")
    if run["source"] != "canvas":
        raise ApiError(409, f"run {run_id} came from POST /api/runs: only a canvas run takes events here")
    if run["status"] in TERMINAL_STATUSES:
        raise ApiError(409, f"run {run_id} already ended ({run['status']})")
    name = parse_name(body)
    if name is not None:
        store.set_name(run_id, name)
    if finished is not None:
        events.append(NewEvent("run_finished", {**finished, "peak_memory": None, "execution_facts": {}}))
    result = store.append_events(run_id, events)
    d.hub.notify(run_id)
    after = store.get_run(run_id) or run
    return web.json_response({"stored": result.stored, "status": after["status"],
                              "cancel_requested": after["cancel_requested"]})


def cancel(request: web.Request, run: dict[str, Any], reason: str | None) -> dict[str, Any]:
    """Cancel of a running canvas run: recorded; the plugin reads it in its next answer and interrupts
    ComfyUI's prompt (the run then ends ``cancelled`` when ComfyUI reports the interruption)."""
    store = request.app[STORE_KEY]
    store.request_cancel(run["id"])
    store.append_events(run["id"], [NewEvent("cancel_requested", {"reason": reason})])
    dispatcher_of(request).hub.notify(run["id"])
    return store.get_run(run["id"]) or run


def setup(app: web.Application) -> None:
    app.router.add_post("/api/canvas/runs", create)
    app.router.add_post("/api/canvas/runs/{run_id}/events", add_events)
    errors = openapi._errors  # the document's one table of error answers
    openapi.describe(app, "post", "/api/canvas/runs", {
        "summary": "Record a run ComfyUI's own Run is executing (the plugin calls this; source canvas)",
        "responses": {"201": {"description": "the run, running",
                              "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Run"}}}},
                      **errors(400, 401, 403, 413)}})
    openapi.describe(app, "post", "/api/canvas/runs/{run_id}/events", {
        "summary": "Append what a canvas run's nodes reported; finished ends it",
        "parameters": [openapi.RUN_ID],
        "responses": {"200": {"description": "stored; cancel_requested: stop ComfyUI's prompt",
                              "content": {"application/json": {"schema": {"type": "object", "properties": {
                                  "stored": {"type": "integer"}, "status": {"type": "string"},
                                  "cancel_requested": {"type": "boolean"}}}}}},
                      **errors(400, 401, 403, 404, 409, 413)}})
