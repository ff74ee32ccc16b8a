"""One-shot worker pool routes (docs/workers.md).

* ``GET /api/pools`` -> ``{"pools": [...]}``: each with its live instances (departed ones are not listed)
* ``POST /api/pools`` ``{"name"}`` -> 201 ``{"name", "credential", "command"}`` (the credential is shown once)
* ``GET /api/pools/{name}``, ``DELETE /api/pools/{name}`` (fails the runs waiting for it)
* ``POST /api/pools/{name}/revoke`` (the credential stops working), ``/reissue`` (a new one)
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ...contracts.workers import PoolCreate, PoolExport
from ...slurm.spec import SpecError, parse_spec
from ...workers.state import WorkerError
from .. import openapi
from ..keys import STORE_KEY
from .common import Body, body, no_body
from .workers import REGISTRY_KEY, server_url

routes = web.RouteTableDef()


@routes.get("/api/pools")
async def list_pools(request: web.Request) -> web.Response:
    return web.json_response({"pools": request.app[REGISTRY_KEY].list_pools()})


@routes.post("/api/pools")
@body(PoolCreate)
async def create_pool(request: web.Request, sent: Body[PoolCreate]) -> web.Response:
    body = sent.raw  # the name and the Slurm settings as sent: the registry checks them (workers/pools.py)
    if "slurm" in body and body["slurm"] is None:
        raise WorkerError("slurm must be an object of settings (or true for the defaults), not null")
    registry = request.app[REGISTRY_KEY]
    slurm = body.get("slurm")
    if slurm is not None and registry.slurm is not None:  # its workdir, confined before anything is written
        try:
            registry.slurm.confine(str(body.get("name")), parse_spec(slurm))
        except SpecError as exc:
            raise WorkerError(str(exc)) from None
    async with request.app[STORE_KEY].acknowledged():  # a 201 once it is in state.db (store.py)
        out = registry.create_pool(body.get("name"), server_url(request), slurm, comfyui=body.get("comfyui"))
    return web.json_response(out, status=201)


@routes.get("/api/pools/{name}")
async def get_pool(request: web.Request) -> web.Response:
    return web.json_response(request.app[REGISTRY_KEY].describe_pool(request.match_info["name"]))


@routes.post("/api/pools/{name}/revoke")
@no_body
async def revoke_pool(request: web.Request) -> web.Response:
    return web.json_response(request.app[REGISTRY_KEY].revoke_pool(request.match_info["name"]))


@routes.post("/api/pools/{name}/reissue")
@no_body
async def reissue_pool(request: web.Request) -> web.Response:
    reg = request.app[REGISTRY_KEY]
    return web.json_response(reg.reissue_pool(request.match_info["name"], server_url(request)))


@routes.post("/api/pools/{name}/export")
@body(PoolExport, required=False)
async def export_pool(request: web.Request, sent: Body[PoolExport]) -> web.Response:
    reg = request.app[REGISTRY_KEY]
    return web.json_response(reg.export_pool(request.match_info["name"], sent.raw, server_url(request)))


@routes.delete("/api/pools/{name}")
async def remove_pool(request: web.Request) -> web.Response:
    return web.json_response(await request.app[REGISTRY_KEY].remove_pool(request.match_info["name"]))


def setup(app: web.Application) -> None:
    app.add_routes(routes)
    err = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}

    def resp(desc: str, *codes: int, ok: str = "200") -> dict[str, Any]:
        return {ok: {"description": desc}, **{str(c): err for c in codes}}

    ops = {
        ("get", "/api/pools"): {"summary": "one-shot worker pools with their live instances",
                                "responses": resp("{\"pools\": [...]}", 401, 403)},
        ("post", "/api/pools"): {
            "summary": "a new pool and its shared credential (shown once) with the command instances run",
            "responses": resp("{\"name\", \"credential\", \"command\"}", 400, 401, 403, 409, ok="201")},
        ("get", "/api/pools/{name}"): {"summary": "one pool", "parameters": [name], "responses": resp("the pool", 404)},
        ("delete", "/api/pools/{name}"): {"summary": "delete the pool; runs waiting for it fail", "parameters": [name],
                                          "responses": resp("what was removed", 404)},
        ("post", "/api/pools/{name}/revoke"): {"summary": "the pool's credential stops working (no new instance)",
                                               "parameters": [name], "responses": resp("the pool", 400, 404)},
        ("post", "/api/pools/{name}/reissue"): {"summary": "a new credential for the pool (the old one stops working)",
                                                "parameters": [name], "responses": resp("credential and command", 400, 404)},
        ("post", "/api/pools/{name}/export"): {
            "summary": "Kubernetes manifests (a Secret and an Indexed Job) whose pods join the pool "
                       "(docs/slurm-and-k8s.md); without credential a manual pool's credential is reissued",
            "parameters": [name], "responses": resp("{\"name\", \"format\", \"reissued\", \"manifests\"}", 400, 404)},
    }
    for (method, path), op in ops.items():
        openapi.describe(app, method, path, op)
