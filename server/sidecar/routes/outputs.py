"""Recorded node outputs of a run (docs/workers.md, ``options.record_outputs``), for the Inspector.

* ``GET /api/runs/{id}/outputs`` -> ``{"run_id", "where", "worker", "complete", "nodes": [...]}``
* ``GET /api/runs/{id}/outputs/{node}`` -> the node's outputs (metrics and text inline; tensors and
  model weights by file, with shape and dtype)
* ``GET /api/runs/{id}/outputs/{node}/{file}`` -> one file's bytes (safetensors, text)

A local run's outputs, and a worker run's uploaded with ``record_outputs: "upload"``, are read here;
otherwise they are read from the worker that ran it, through its agent connection: 409 naming the
worker while it is not connected.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ....common.errors import ApiError
from ....constants import TERMINAL_STATUSES
from ...run.outputs import INDEX_NAME, NODE_MANIFEST, record_mode, safe_name
from ...workers.outputs import MAX_READ_BYTES
from .. import openapi
from .common import run_or_404

_TYPES = {".json": "application/json", ".txt": "text/plain; charset=utf-8", ".safetensors": "application/octet-stream"}


def _registry(request: web.Request) -> Any:
    from .workers import REGISTRY_KEY

    return request.app[REGISTRY_KEY]


def _checked_run(request: web.Request) -> dict[str, Any]:
    run = run_or_404(request)
    if record_mode(run.get("options") or {}) is None:
        raise ApiError(404, f"run {run['id']} did not record its outputs: submit it with options.record_outputs "
                            f"true (kept where it runs) or \"upload\"")
    if run["status"] in ("queued", "assigned"):
        raise ApiError(409, f"run {run['id']} is {run['status']}: its outputs are recorded as its nodes finish")
    return run


async def _read(request: web.Request, run: dict[str, Any], name: str) -> tuple[bytes, str]:
    """A recorded file's bytes and where they came from (``sidecar`` or ``worker``)."""
    reg = _registry(request)
    local = reg.uploaded_dir(run["id"])
    if (local / INDEX_NAME).is_file():
        path = (local / name).resolve()
        if not path.is_relative_to(local.resolve()) or not path.is_file():
            raise ApiError(404, f"run {run['id']} recorded no file {name!r}")
        return path.read_bytes(), "sidecar"
    if not run.get("worker_id"):
        raise ApiError(404, f"run {run['id']} recorded no outputs here (its run ended before the first node)")
    return await reg.read_whole(run["worker_id"], run["id"], name, MAX_READ_BYTES), "worker"


async def _index(request: web.Request, run: dict[str, Any]) -> tuple[dict[str, Any], str]:
    data, where = await _read(request, run, INDEX_NAME)
    return json.loads(data), where


def _facts(run: dict[str, Any]) -> dict[str, Any]:
    return dict((run.get("execution_facts") or {}).get("recorded_outputs") or {})


routes = web.RouteTableDef()


@routes.get("/api/runs/{run_id}/outputs")
async def list_outputs(request: web.Request) -> web.Response:
    run = _checked_run(request)
    index, where = await _index(request, run)
    return web.json_response({"run_id": run["id"], "status": run["status"], "where": where,
                              "worker": run.get("worker_id"), "mode": record_mode(run.get("options") or {}),
                              "upload": _facts(run) or None,
                              "complete": bool(index.get("complete")) or run["status"] in TERMINAL_STATUSES,
                              "nodes": index.get("nodes") or []})


def _entry(index: dict[str, Any], run_id: str, node: str) -> dict[str, Any]:
    entry = next((n for n in index.get("nodes") or [] if str(n.get("node")) == node), None)
    if entry is None:
        have = ", ".join(str(n.get("node")) for n in index.get("nodes") or []) or "none yet"
        raise ApiError(404, f"run {run_id} recorded no outputs for node {node!r} (nodes: {have})")
    return entry


@routes.get("/api/runs/{run_id}/outputs/{node}")
async def node_outputs(request: web.Request) -> web.Response:
    run = _checked_run(request)
    node = request.match_info["node"]
    index, _ = await _index(request, run)
    _entry(index, run["id"], node)
    data, where = await _read(request, run, f"{safe_name(node)}/{NODE_MANIFEST}")
    return web.json_response({**json.loads(data), "run_id": run["id"], "where": where,
                              "worker": run.get("worker_id")})


@routes.get("/api/runs/{run_id}/outputs/{node}/{file}")
async def output_file(request: web.Request) -> web.Response:
    run = _checked_run(request)
    node, fname = request.match_info["node"], request.match_info["file"]
    index, _ = await _index(request, run)
    entry = _entry(index, run["id"], node)
    if fname not in (entry.get("files") or []):
        raise ApiError(404, f"node {node} of run {run['id']} recorded no file {fname!r} "
                            f"(files: {', '.join(entry.get('files') or [])})")
    data, where = await _read(request, run, f"{safe_name(node)}/{fname}")
    ext = "." + fname.rsplit(".", 1)[-1] if "." in fname else ""
    return web.Response(body=data, content_type=_TYPES.get(ext, "application/octet-stream").split(";")[0],
                        headers={"X-Xpufleet-Outputs-From": where,
                                 "Content-Disposition": f'attachment; filename="{run["id"]}-{safe_name(node)}-{fname}"'})


def setup(app: web.Application) -> None:
    """Add the recorded-outputs routes and their descriptions."""
    app.add_routes(routes)
    run_id = {"name": "run_id", "in": "path", "required": True, "schema": {"type": "string"}}
    node = {"name": "node", "in": "path", "required": True, "schema": {"type": "string"}, "description": "node id"}
    fname = {"name": "file", "in": "path", "required": True, "schema": {"type": "string"},
             "description": "a file the node's outputs list (e.g. 0_model.safetensors)"}
    err = {"description": "error", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    errors = {"401": err, "403": err, "404": err,
              "409": {**err, "description": "not started yet, or the worker that keeps them is not connected"}}
    ops = {
        "/api/runs/{run_id}/outputs": ("every node whose outputs the run recorded (record_outputs)", [run_id]),
        "/api/runs/{run_id}/outputs/{node}": ("one node's recorded outputs: metrics and text inline, tensors by file",
                                              [run_id, node]),
        "/api/runs/{run_id}/outputs/{node}/{file}": ("a recorded file's bytes (safetensors, text)",
                                                     [run_id, node, fname]),
    }
    for path, (summary, params) in ops.items():
        openapi.describe(app, "get", path, {"summary": summary, "parameters": params,
                                            "responses": {"200": {"description": "ok"}, **errors}})
