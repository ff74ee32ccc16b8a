"""Canvas runs (docs/canvas-runs.md): a graph run by ComfyUI's own Run button executes in ComfyUI's process;
the plugin there records it here, so it is listed by ``GET /api/runs`` (source ``canvas``) with its events
and metric series like any run.

- ``POST /api/canvas/runs`` ``{"prompt_id", "name", "graph", "comfy_pid"}``: a running run (201). The pid
  must be the process that sent the request (canvas_liveness.py), else 400.
- ``POST /api/canvas/runs/{run_id}/events`` ``{"events": [{"type", "payload", "ts", "seq"}], "finished"?}``:
  what its nodes reported (``seq`` makes a resent batch count once); ``finished`` ``{"status", "error",
  "final_metrics"}`` ends it. The answer says whether a cancel was asked (``cancel_requested``): the
  plugin then interrupts ComfyUI's prompt, as ComfyUI's own Cancel does. Past
  ``CANVAS_RUN_EVENTS_MAX`` events or ``CANVAS_RUN_EVENT_BYTES_MAX`` bytes of payload a run stores
  nothing more: 413, and the run ends ``interrupted`` saying so.

Only the plugin calls these, with the session token it reads from the runtime file, as the proxy does.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ....common.errors import ApiError
from ....constants import CANVAS_RUN_EVENT_BYTES_MAX, CANVAS_RUN_EVENTS_MAX, TERMINAL_STATUSES
from ...contracts.misc import CanvasEvents, CanvasRun
from ...run.events import NewEvent
from .. import openapi
from ..canvas_liveness import NotTheCaller, comfy_alive, verify_caller
from ..keys import STORE_KEY
from .common import Body, body, dispatcher_of, public_run

routes = web.RouteTableDef()
# run id -> [events, payload bytes] stored, counted from the database once per run and sidecar
USAGE_KEY = web.AppKey("canvas_usage", dict)


def clean_name(name: str | None) -> str | None:
    """A run name as stored: stripped, None when empty."""
    return (name or "").strip() or None


def _end_stale(request: web.Request, comfy_pid: int) -> None:
    """End the running canvas runs whose ComfyUI is gone, or whose ComfyUI started another prompt (one
    ComfyUI runs one prompt at a time, so that run's end was lost): they would stay running forever."""
    store, d = request.app[STORE_KEY], dispatcher_of(request)
    running, _ = store.list_runs(statuses=["running"], source="canvas", limit=1000)
    for run in running:
        pid = run["execution_facts"].get("comfy_pid")
        if pid == comfy_pid or not comfy_alive(run["execution_facts"]):
            why = ("ComfyUI started another prompt before this run's end reached the server" if pid == comfy_pid
                   else f"ComfyUI (pid {pid}) is gone; the run's end never reached the server")
            if store.finish(run["id"], "interrupted", error=why):
                d.hub.notify(run["id"])


@routes.post("/api/canvas/runs")
@body(CanvasRun)
async def create(request: web.Request, sent: Body[CanvasRun]) -> web.Response:
    new = sent.model
    transport = request.transport
    try:  # the pid must be the ComfyUI that sent this: a pid alone (1, anyone's) would keep the run forever
        started = verify_caller(new.comfy_pid, transport.get_extra_info("peername") if transport else None,
                                transport.get_extra_info("sockname") if transport else None)
    except NotTheCaller as exc:
        raise ApiError(400, str(exc)) from None
    _end_stale(request, new.comfy_pid)
    facts = {"comfy_pid": new.comfy_pid, "comfy_prompt_id": new.prompt_id, "comfy_started": started}
    store = request.app[STORE_KEY]
    async with store.acknowledged():  # a 201 once it is in state.db (store.py)
        run_id = store.create_canvas_run(graph=dict(sent.raw["graph"]), name=clean_name(new.name), facts=facts)
    return web.json_response(public_run(store.get_run(run_id)), status=201)


@routes.post("/api/canvas/runs/{run_id}/events")
@body(CanvasEvents)
async def add_events(request: web.Request, sent: Body[CanvasEvents]) -> web.Response:
    store, d = request.app[STORE_KEY], dispatcher_of(request)
    run_id = request.match_info["run_id"]
    run = store.get_run(run_id)
    if run is None:
        raise ApiError(404, f"no run {run_id!r}")
    if run["source"] != "canvas":
        raise ApiError(409, f"run {run_id} came from POST /api/runs: only a canvas run takes events here")
    if run["status"] == "cancelled" and run["cancel_requested"]:  # ended here: ComfyUI should stop it still
        return web.json_response({"stored": 0, "status": run["status"], "cancel_requested": True})
    if run["status"] in TERMINAL_STATUSES:
        raise ApiError(409, f"run {run_id} already ended ({run['status']})")
    _within_cap(request, run_id, sent.raw["events"])
    name = clean_name(sent.model.name)
    if name is not None:
        store.set_name(run_id, name)
    events = [NewEvent(ev["type"], dict(ev["payload"]), float(ev["ts"]), ev["seq"]) for ev in sent.raw["events"]]
    finished = sent.model.finished
    if finished is not None:  # the metrics as sent (the model's numbers are floats)
        metrics = dict(sent.raw["finished"].get("final_metrics") or {})
        events.append(NewEvent("run_finished", {"status": finished.status, "error": finished.error,
                                                "final_metrics": metrics, "peak_memory": None, "execution_facts": {}}))
    result = store.append_events(run_id, events)
    if result.stored:
        usage = request.app[USAGE_KEY][run_id]
        usage[0] += result.stored
        usage[1] += sum(len(json.dumps(ev["payload"])) for ev in sent.raw["events"])
    d.hub.notify(run_id)
    after = store.get_run(run_id) or run
    if after["status"] in TERMINAL_STATUSES:
        request.app[USAGE_KEY].pop(run_id, None)
    return web.json_response({"stored": result.stored, "status": after["status"],
                              "cancel_requested": after["cancel_requested"]})


def _within_cap(request: web.Request, run_id: str, events: list[dict[str, Any]]) -> None:
    """413 (and the run ends ``interrupted``) when this batch would take the run past its cap."""
    usage = request.app[USAGE_KEY]
    store = request.app[STORE_KEY]
    if run_id not in usage:
        row = store.query("SELECT COUNT(*) AS n, COALESCE(SUM(LENGTH(payload)), 0) AS b FROM events WHERE run_id=?",
                          (run_id,))[0]
        usage[run_id] = [int(row["n"]), int(row["b"])]
    count, size = usage[run_id]
    size += sum(len(json.dumps(ev["payload"])) for ev in events)
    if count + len(events) <= CANVAS_RUN_EVENTS_MAX and size <= CANVAS_RUN_EVENT_BYTES_MAX:
        return
    why = (f"run {run_id} reached the most a canvas run keeps ({CANVAS_RUN_EVENTS_MAX} events or "
           f"{CANVAS_RUN_EVENT_BYTES_MAX // 2**20} MiB of event payloads): its recording stopped here; ComfyUI "
           f"may have gone on running the prompt")
    if store.finish(run_id, "interrupted", error=why):
        dispatcher_of(request).hub.notify(run_id)
    usage.pop(run_id, None)
    raise ApiError(413, why)


def cancel(request: web.Request, run: dict[str, Any], reason: str | None) -> dict[str, Any]:
    """Cancel of a running canvas run: recorded; the plugin reads it in its next answer and interrupts
    ComfyUI's prompt (the run then ends ``cancelled`` when ComfyUI reports the interruption). A run whose
    ComfyUI is gone ends ``cancelled`` at once; one whose ComfyUI does not confirm within
    ``CANVAS_CANCEL_GRACE_S`` is ended by the sidecar (recovery.py's watch)."""
    store = request.app[STORE_KEY]
    store.request_cancel(run["id"])
    store.append_events(run["id"], [NewEvent("cancel_requested", {"reason": reason})])
    if not comfy_alive(run["execution_facts"]):
        store.finish(run["id"], "cancelled", error=f"cancelled; its ComfyUI (pid {run['execution_facts'].get('comfy_pid')}) "
                                                   f"was gone")
    dispatcher_of(request).hub.notify(run["id"])
    return store.get_run(run["id"]) or run


def setup(app: web.Application) -> None:
    app.add_routes(routes)
    app[USAGE_KEY] = {}
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
