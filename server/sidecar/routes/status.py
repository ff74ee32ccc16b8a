"""``GET /api/health``, ``GET /api/status``, ``GET /api/openapi.json``."""

from __future__ import annotations

import os
import time

from aiohttp import web

from ....constants import (
    VERSION,
)
from .. import openapi
from ..keys import CONFIG_KEY, STARTED_KEY, STORE_KEY
from .common import dispatcher_of

routes = web.RouteTableDef()


@routes.get("/api/health")
async def health(request: web.Request) -> web.Response:
    """Liveness, and whether ``state.db`` takes writes: ``status`` is ``degraded`` and ``store.ok`` false
    (with the reason) while it does not, so creates are answered 507/503. Still a 200: the CLI and
    ComfyUI's proxy find the running sidecar by this answer, and reads keep working meanwhile."""
    failure = request.app[STORE_KEY].failure
    store: dict[str, object] = {"ok": failure is None}
    if failure is not None:
        store.update(error=failure.text, kind=failure.kind, failing_for_s=round(time.monotonic() - failure.since, 1))
    return web.json_response({"status": "ok" if failure is None else "degraded", "name": "xpufleet",
                              "version": VERSION, "store": store})


@routes.get("/api/status")
async def status(request: web.Request) -> web.Response:
    d = dispatcher_of(request)
    state = d.slot_state()
    slots = [{"key": s.key, "label": s.label, "kind": s.kind, "used": s.used, "limit": s.limit,
              "limit_from": s.limit_from, "providers": s.shared_by(), "runs": s.holders}
             for s in state.slots.values()]
    providers = [{"name": p.name, "local": p.is_local, "online": p.online, "draining": p.draining,
                  "devices": p.device_names()} for p in d.provider_infos()]
    cfg = request.app[CONFIG_KEY]
    return web.json_response({
        "status": "ok", "version": VERSION, "pid": os.getpid(), "home": str(cfg.home),
        "started_at": request.app[STARTED_KEY], "runs": d.store.counts(), "queue_length": d.queue_length(),
        "providers": providers, "slots": slots, "plans": d.plans,
    })


@routes.get("/api/openapi.json")
async def openapi_doc(request: web.Request) -> web.Response:
    return web.json_response(openapi.document(request.app))


def setup(app: web.Application) -> None:
    """Add the status routes (described in openapi.RUN_OPERATIONS)."""
    app.add_routes(routes)
