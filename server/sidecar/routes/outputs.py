"""Recorded node outputs of a run (docs/workers.md, ``options.record_outputs``), for the Inspector.

* ``GET /api/runs/{id}/outputs`` -> ``{"run_id", "where", "worker", "complete", "nodes": [...]}``
* ``GET /api/runs/{id}/outputs/{node}`` -> the node's outputs (metrics and text inline; tensors and
  model weights by file, with shape and dtype)
* ``GET /api/runs/{id}/outputs/{node}/{file}`` -> one file's bytes (safetensors, text; a ComfyUI run's images,
  videos and audio inline with their media type)

A local run's outputs, and a worker run's uploaded with ``record_outputs: "upload"``, are read here;
otherwise they are read from the worker that ran it, through its agent connection: 409 naming the
worker while it is not connected.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from ....common.errors import ApiError
from ....constants import RUN_KIND_COMFYUI, TERMINAL_STATUSES
from ...run.outputs import INDEX_NAME, NODE_MANIFEST, record_mode, safe_name
from ...workers.outputs import MAX_READ_BYTES
from .. import openapi
from .common import run_or_404

_TYPES = {".json": "application/json", ".txt": "text/plain; charset=utf-8", ".safetensors": "application/octet-stream"}
# What a ComfyUI run's output nodes write that a browser shows as it is (the Runs panel's gallery)
_INLINE = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp",
           ".gif": "image/gif", ".mp4": "video/mp4", ".webm": "video/webm", ".wav": "audio/wav",
           ".mp3": "audio/mpeg", ".flac": "audio/flac", ".ogg": "audio/ogg"}


def _registry(request: web.Request) -> Any:
    from .workers import REGISTRY_KEY

    return request.app[REGISTRY_KEY]


def _is_comfyui(run: dict[str, Any]) -> bool:
    """A ComfyUI run records its output nodes' files always, uploaded here at its end (workers/outputs.py)."""
    return run.get("kind") == RUN_KIND_COMFYUI


def _mode(run: dict[str, Any]) -> str | None:
    return "upload" if _is_comfyui(run) else record_mode(run.get("options") or {})


def _media(run: dict[str, Any], fname: str) -> tuple[str, bool]:
    """A file's media type and whether it is shown inline: a ComfyUI run's image, video or audio (never a
    type a browser would run, such as SVG or HTML); anything else is a download."""
    ext = "." + fname.rsplit(".", 1)[-1].lower() if "." in fname else ""
    if _is_comfyui(run) and ext in _INLINE:
        return _INLINE[ext], True
    return _TYPES.get(ext, "application/octet-stream").split(";")[0], False


def _checked_run(request: web.Request) -> dict[str, Any]:
    run = run_or_404(request)
    if _mode(run) is None:
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
                              "worker": run.get("worker_id"), "mode": _mode(run), "kind": run.get("kind"),
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
    media, inline = _media(run, fname)
    disposition = "inline" if inline else "attachment"
    return web.Response(body=data, content_type=media,
                        headers={"X-Xpufleet-Outputs-From": where, "X-Content-Type-Options": "nosniff",
                                 "Content-Disposition": f'{disposition}; filename="{run["id"]}-{safe_name(node)}-{fname}"'})


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
