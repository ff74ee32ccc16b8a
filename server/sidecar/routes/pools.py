"""One-shot worker pool routes (docs/workers.md).

* ``GET /api/pools`` -> ``{"pools": [...]}``: each with its live instances (departed ones are not listed)
* ``POST /api/pools`` ``{"name"}`` -> 201 ``{"name", "credential", "command"}`` (the credential is shown once)
* ``GET /api/pools/{name}``, ``DELETE /api/pools/{name}`` (fails the runs waiting for it)
* ``POST /api/pools/{name}/revoke`` (the credential stops working), ``/reissue`` (a new one)
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from ....common.http import read_object
from ...workers.state import WorkerError
from .. import openapi
from .workers import REGISTRY_KEY, server_url


async def list_pools(request: web.Request) -> web.Response:
    return web.json_response({"pools": request.app[REGISTRY_KEY].list_pools()})


async def create_pool(request: web.Request) -> web.Response:
    body = await read_object(request, {"name", "slurm"})
    if "slurm" in body and body["slurm"] is None:
        raise WorkerError("slurm must be an object of settings (or true for the defaults), not null")
    out = request.app[REGISTRY_KEY].create_pool(body.get("name"), server_url(request), body.get("slurm"))
    return web.json_response(out, status=201)


async def get_pool(request: web.Request) -> web.Response:
    return web.json_response(request.app[REGISTRY_KEY].describe_pool(request.match_info["name"]))


async def revoke_pool(request: web.Request) -> web.Response:
    await read_object(request, set(), optional=True)
    return web.json_response(request.app[REGISTRY_KEY].revoke_pool(request.match_info["name"]))


async def reissue_pool(request: web.Request) -> web.Response:
    await read_object(request, set(), optional=True)
    reg = request.app[REGISTRY_KEY]
    return web.json_response(reg.reissue_pool(request.match_info["name"], server_url(request)))


async def export_pool(request: web.Request) -> web.Response:
    body = await read_object(request, {"format", "image", "namespace", "gpus", "instances", "python", "node_selector",
                                       "server_url", "credential"}, optional=True)
    reg = request.app[REGISTRY_KEY]
    return web.json_response(reg.export_pool(request.match_info["name"], body, server_url(request)))


async def remove_pool(request: web.Request) -> web.Response:
    return web.json_response(await request.app[REGISTRY_KEY].remove_pool(request.match_info["name"]))


_STR, _INT, _NUM = {"type": "string"}, {"type": "integer"}, {"type": "number"}
SLURM_SCHEMA = {"description": "a Slurm pool (docs/slurm-and-k8s.md); true: the defaults", "oneOf": [
    {"type": "boolean", "enum": [True]},
    {"type": "object", "additionalProperties": False, "properties": {
        "partition": _STR, "gres": _STR, "time_limit": _STR, "account": _STR,
        "sbatch_args": {"type": "array", "items": _STR}, "python": _STR, "max_jobs": _INT, "idle_exit_s": _NUM,
        "retries": _INT, "simulate_gib": _NUM, "server_url": _STR, "workdir": _STR}}]}


def setup(app: web.Application) -> None:
    r = app.router
    r.add_get("/api/pools", list_pools)
    r.add_post("/api/pools", create_pool)
    r.add_get("/api/pools/{name}", get_pool)
    r.add_delete("/api/pools/{name}", remove_pool)
    r.add_post("/api/pools/{name}/revoke", revoke_pool)
    r.add_post("/api/pools/{name}/reissue", reissue_pool)
    r.add_post("/api/pools/{name}/export", export_pool)
    err = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}

    def resp(desc: str, *codes: int, ok: str = "200") -> dict[str, Any]:
        return {ok: {"description": desc}, **{str(c): err for c in codes}}

    ops = {
        ("get", "/api/pools"): {"summary": "one-shot worker pools with their live instances",
                                "responses": resp("{\"pools\": [...]}", 401, 403)},
        ("post", "/api/pools"): {
            "summary": "a new pool and its shared credential (shown once) with the command instances run",
            "requestBody": {"required": True, "content": {"application/json": {"schema": {
                "type": "object", "required": ["name"], "additionalProperties": False,
                "properties": {"name": {"type": "string"}, "slurm": SLURM_SCHEMA}}}}},
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
            "parameters": [name], "requestBody": {"required": False, "content": {"application/json": {"schema": {
                "type": "object", "additionalProperties": False, "properties": {
                    "format": {"type": "string", "enum": ["k8s"]}, "image": {"type": "string"},
                    "namespace": {"type": "string"}, "gpus": {"type": "integer"}, "instances": {"type": "integer"},
                    "python": {"type": "string"}, "server_url": {"type": "string"}, "credential": {"type": "string"},
                    "node_selector": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}, "responses": resp("{\"name\", \"format\", \"reissued\", \"manifests\"}", 400, 404)},
    }
    for (method, path), op in ops.items():
        openapi.describe(app, method, path, op)
