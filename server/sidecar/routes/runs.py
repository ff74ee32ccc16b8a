"""The run routes (docs/sidecar.md): submit, list, one run, cancel, delete, events (long-poll and SSE)."""

from __future__ import annotations

import asyncio
import contextlib

from aiohttp import web

from ....common.errors import ApiError
from ....common.http import INT_PARAM_MAX, float_param, int_param
from ....constants import (
    EVENTS_LONG_POLL_MAX_S,
    EVENTS_PAGE_MAX,
    RUN_SOURCES,
    RUN_STATUSES,
    RUNS_PAGE_MAX,
    TERMINAL_STATUSES,
)
from ...contracts.runs import Cancel, RunSubmit
from ...memory.views import run_fields
from ...run.requests import RunRequest, run_request_of
from ..event_feed import event_texts, events_page_json, stream_events
from ..keys import STORE_KEY
from . import canvas
from .common import Body, body, dispatcher_of, public_run, run_or_404

routes = web.RouteTableDef()


@routes.post("/api/runs")
@body(RunSubmit, off_loop=True, then=run_request_of)
async def submit_run(request: web.Request, sent: Body[RunSubmit]) -> web.Response:
    # Parsing, the shape check, graph validation and the graph key are linear but can take a few hundred
    # ms for the largest graph: they run in a thread, so heartbeats and other requests never wait on them.
    req: RunRequest = sent.built
    d = dispatcher_of(request)
    facts = await d.check_graph(req)
    result = (await d.enqueue_off_loop([d.admit(req, facts=facts)]))[0]  # the write (the graph's JSON) too
    return web.json_response(result, status=201)


@routes.get("/api/runs")
async def list_runs(request: web.Request) -> web.Response:
    statuses = None
    raw = request.query.get("status")
    if raw:
        statuses = [s.strip() for s in raw.split(",") if s.strip()]
        bad = [s for s in statuses if s not in RUN_STATUSES]
        if bad:
            raise ApiError(400, f"status: unknown {', '.join(bad)}; use {', '.join(RUN_STATUSES)}")
    source = request.query.get("source") or None
    if source is not None and source not in RUN_SOURCES:
        raise ApiError(400, f"source: unknown {source!r}; use {' or '.join(RUN_SOURCES)}")
    limit = int_param(request, "limit", 50, 1, RUNS_PAGE_MAX)
    offset = int_param(request, "offset", 0, 0)
    runs, total = request.app[STORE_KEY].list_runs(
        statuses=statuses, name=request.query.get("name") or None, worker=request.query.get("worker") or None,
        source=source, limit=limit, offset=offset)
    d = dispatcher_of(request)
    memory = run_fields(d.memory, runs)
    return web.json_response({"runs": [public_run(r, d, memory.get(r["id"])) for r in runs], "total": total,
                              "limit": limit, "offset": offset})


@routes.get("/api/runs/{run_id}")
async def get_run(request: web.Request) -> web.Response:
    return web.json_response(public_run(run_or_404(request, with_graph=True), dispatcher_of(request)))


@routes.post("/api/runs/{run_id}/cancel")
@body(Cancel, required=False)
async def cancel_run(request: web.Request, sent: Body[Cancel]) -> web.Response:
    reason = sent.model.reason
    d = dispatcher_of(request)
    run = run_or_404(request)
    if run["source"] == "canvas" and run["status"] not in TERMINAL_STATUSES:  # ComfyUI runs it, not a provider
        return web.json_response(public_run(canvas.cancel(request, run, reason), d))
    run = await d.cancel(run["id"], reason)
    return web.json_response(public_run(run, d))


@routes.delete("/api/runs/{run_id}")
async def delete_run(request: web.Request) -> web.Response:
    run = dispatcher_of(request).delete(request.match_info["run_id"])
    return web.json_response({"deleted": run["id"], "status": run["status"]})


@routes.get("/api/runs/{run_id}/events")
async def run_events(request: web.Request) -> web.Response:
    run = run_or_404(request)
    run_id = run["id"]
    cursor = int_param(request, "cursor", 0, 0)
    wait = float_param(request, "wait", 0.0, 0.0, EVENTS_LONG_POLL_MAX_S)
    limit = int_param(request, "limit", 500, 1, EVENTS_PAGE_MAX)
    types = [t.strip() for t in request.query.get("type", "").split(",") if t.strip()] or None
    d = dispatcher_of(request)
    store = request.app[STORE_KEY]
    waiter = d.hub.waiter(run_id)  # before reading: a notification in between is not lost
    events = event_texts(store, run_id, cursor, limit, types)  # at most EVENTS_PAGE_MAX, payloads not decoded
    if not events and wait > 0 and run["status"] not in TERMINAL_STATUSES and not d.shutting_down:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(waiter.wait(), wait)
        events = event_texts(store, run_id, cursor, limit, types)
    run = store.get_run(run_id) or run
    last = store.last_cursor(run_id) or 0
    new_cursor = events[-1].cursor if events else cursor
    if types:  # filtered: skip past unmatched events too
        new_cursor = max(new_cursor, last) if len(events) < limit else new_cursor
    done = run["status"] in TERMINAL_STATUSES and new_cursor >= last
    return web.Response(text=events_page_json(events, cursor=new_cursor, status=run["status"], done=done),
                        content_type="application/json")


@routes.get("/api/runs/{run_id}/events/stream")
async def run_events_stream(request: web.Request) -> web.StreamResponse:
    run = run_or_404(request)
    run_id = run["id"]
    cursor = int_param(request, "cursor", 0, 0)
    last_id = request.headers.get("Last-Event-ID")
    if last_id:
        try:
            given = int(last_id)
        except ValueError:
            given = -1
        if not 0 <= given <= INT_PARAM_MAX:
            raise ApiError(400, f"Last-Event-ID: must be an event cursor (an integer >= 0), got {last_id!r}")
        cursor = max(cursor, given)
    d = dispatcher_of(request)
    store = request.app[STORE_KEY]

    def ended() -> bool:
        current = store.get_run(run_id)
        return current is None or current["status"] in TERMINAL_STATUSES or d.shutting_down

    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    # bounded steps that yield, and no more than EVENTS_STREAM_BUFFERED_BYTES unsent per client (event_feed.py)
    await stream_events(request, resp, store, d.hub, run_id, cursor, ended)
    await resp.write_eof()
    return resp


def setup(app: web.Application) -> None:
    """Add the run routes (their descriptions are openapi.RUN_OPERATIONS)."""
    app.add_routes(routes)
    canvas.setup(app)  # runs ComfyUI's own Run executes, recorded by the plugin (routes/canvas.py)
