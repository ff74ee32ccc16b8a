"""Service routes of the sidecar (docs/services.md, docs/sidecar.md): distributed inference Units.

``setup(app)`` (called by ``create_app``, after the worker routes: it needs their registry) adds:

* ``POST /api/services`` (201) a service; ``GET /api/services`` -> ``{"services": [...]}``;
* ``GET /api/services/{name}``: units and, per instance, rank, worker, card, pid, generation, state,
  restarts, last exit cause; ``PUT /api/services/{name}``: a rolling update to a new spec (202);
  ``DELETE /api/services/{name}``: drain and stop every unit;
* ``POST /api/services/{name}/infer``: one request, sent to rank 0 of a ready unit (server/units/router.py);
* ``GET /api/services/{name}/export?format=lws``: the Kubernetes LeaderWorkerSet manifest (YAML).
"""

from __future__ import annotations

from aiohttp import web

from ....common.errors import ApiError
from ...contracts.services import InferRequest, ServiceSpec, ServiceUpdate
from ...units.links import RegistryLinks
from ...units.lws import DEFAULT_IMAGE, lws_manifest, to_yaml
from ...units.manager import UnitManager
from .. import openapi
from ..keys import DISPATCHER_KEY, STORE_KEY
from .common import Body, body, passed_through
from .workers import REGISTRY_KEY

UNITS_KEY = web.AppKey("xpufleet_units", UnitManager)
EXPORT_FORMATS = ("lws",)


def _manager(request: web.Request) -> UnitManager:
    return request.app[UNITS_KEY]


routes = web.RouteTableDef()


@routes.post("/api/services")
@body(ServiceSpec)
async def create_service(request: web.Request, sent: Body[ServiceSpec]) -> web.Response:
    async with request.app[STORE_KEY].acknowledged():  # a 201 once it is in state.db (store.py)
        out = _manager(request).create(sent.raw)  # units/spec.py: the rules after it
    return web.json_response(out, status=201)


@routes.get("/api/services")
async def list_services(request: web.Request) -> web.Response:
    return web.json_response({"services": _manager(request).list()})


@routes.get("/api/services/{name}")
async def get_service(request: web.Request) -> web.Response:
    m = _manager(request)
    return web.json_response(m.describe(m.get(request.match_info["name"])))


@routes.put("/api/services/{name}")
@body(ServiceUpdate)
async def update_service(request: web.Request, sent: Body[ServiceUpdate]) -> web.Response:
    out = _manager(request).update(request.match_info["name"], sent.raw)
    return web.json_response(out, status=200 if out.get("unchanged") else 202)


@routes.delete("/api/services/{name}")
async def delete_service(request: web.Request) -> web.Response:
    return web.json_response(await _manager(request).delete(request.match_info["name"]))


@routes.post("/api/services/{name}/infer")
@passed_through(InferRequest)
async def infer(request: web.Request) -> web.Response:
    data = await request.read()
    if not data.strip():
        raise ApiError(400, "the body is empty: send the request for the service's program (the built-in model "
                            "server takes {\"inputs\": [sample, ...]})")
    status, payload, headers = await _manager(request).router.infer(
        request.match_info["name"], data, request.headers.get("Content-Type"))
    return web.Response(body=payload, status=status, headers=headers)


@routes.get("/api/services/{name}/export")
async def export_service(request: web.Request) -> web.Response:
    m = _manager(request)
    svc = m.get(request.match_info["name"])
    fmt = request.query.get("format", "lws")
    if fmt not in EXPORT_FORMATS:
        raise ApiError(400, f"format: must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    image = request.query.get("image") or DEFAULT_IMAGE
    namespace = request.query.get("namespace") or None
    try:
        text = to_yaml(lws_manifest(svc.spec, image=image, namespace=namespace))
    except ValueError as exc:  # the image or namespace asked for
        raise ApiError(400, str(exc)) from None
    return web.Response(text=text, content_type="application/yaml")


def setup(app: web.Application) -> None:
    """Create the unit manager and add the service routes to the sidecar ``app``."""
    registry = app[REGISTRY_KEY]
    manager = UnitManager(app[STORE_KEY], app[DISPATCHER_KEY], RegistryLinks(registry.workers))
    for mtype, handler in manager.message_handlers().items():  # the agents' instance reports
        registry.register_handler(mtype, handler)
    registry.add_connection_listener(manager.on_connection)
    app[UNITS_KEY] = manager
    app.add_routes(routes)
    for (method, path), op in openapi.SERVICE_OPERATIONS.items():
        openapi.describe(app, method, path, op)

    async def on_startup(app: web.Application) -> None:  # after the dispatcher started
        await manager.start()

    async def on_shutdown(app: web.Application) -> None:  # instances keep running on their workers
        await manager.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.append(on_shutdown)
