"""HTTP routes of the predictor.

- Inside ComfyUI (``add_comfy_routes``): ``GET {prefix}/snapshot`` and ``POST {prefix}/predict``, with
  the ComfyUI process's own allocator figures and ComfyUI's model folders.
- On the sidecar (``add_sidecar_routes``): ``GET /api/snapshot`` and ``POST /api/predict``; a body
  naming ``worker`` + ``device`` uses that worker card's heartbeat figures, otherwise this machine's.

Errors are ``{"error": "<what to fix>"}`` with a 4xx status. The work runs in a thread so a slow
disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from ..constants import MAX_REQUEST_BODY_BYTES

log = logging.getLogger("xpufleet")


def _web():
    from aiohttp import web  # lazy: the predictor package itself needs no aiohttp

    return web


def _error(status: int, message: str):
    return _web().json_response({"error": message}, status=status)


async def _read_body(request) -> tuple[dict[str, Any] | None, Any]:
    """(body, None) or (None, error response)."""
    if request.content_length is not None and request.content_length > MAX_REQUEST_BODY_BYTES:
        return None, _error(413, f"request body over {MAX_REQUEST_BODY_BYTES} bytes")
    raw = await request.content.read(MAX_REQUEST_BODY_BYTES + 1)
    if len(raw) > MAX_REQUEST_BODY_BYTES:
        return None, _error(413, f"request body over {MAX_REQUEST_BODY_BYTES} bytes")
    try:
        body = json.loads(raw or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, _error(400, f"request body is not JSON: {exc}")
    if not isinstance(body, dict):
        return None, _error(400, "request body must be an object {\"workflow\": ...}")
    if "workflow" not in body:
        return None, _error(400, "request body needs \"workflow\": a ComfyUI workflow (UI or API format)")
    unknown = sorted(set(body) - {"workflow", "platform", "options", "snapshot", "worker", "device"})
    if unknown:
        return None, _error(400, f"unknown field(s) {', '.join(unknown)}; "
                                 "fields: workflow, platform, options, snapshot, worker, device")
    return body, None


def _predict_sync(body: dict[str, Any], snapshot) -> dict[str, Any]:
    from .service import apply_override, predict_workflow

    snap = apply_override(snapshot, body.get("snapshot"))
    return predict_workflow(body["workflow"], snap, platform=body.get("platform"), options=body.get("options"))


def _own_snapshot(device: str | None):
    from .snapshot import take_snapshot

    return take_snapshot(device, import_torch=False)


def _snapshots_payload(device: str | None) -> dict[str, Any]:
    from .snapshot import default_device, take_snapshots

    snaps = take_snapshots(import_torch=False)
    chosen = _own_snapshot(device or default_device(snaps))
    return {"snapshot": chosen.to_dict(), "snapshots": [s.to_dict() for s in snaps]}


def add_comfy_routes(routes: Any, prefix: str) -> None:
    """Register ``GET {prefix}/snapshot`` and ``POST {prefix}/predict`` on ComfyUI's RouteTableDef."""
    web = _web()

    @routes.get(f"{prefix}/snapshot")
    async def _snapshot(request: web.Request) -> web.Response:
        try:
            payload = await asyncio.to_thread(_snapshots_payload, request.query.get("device"))
        except ValueError as exc:
            return _error(404, str(exc))
        return web.json_response(payload)

    @routes.post(f"{prefix}/predict")
    async def _predict(request: web.Request) -> web.Response:
        body, err = await _read_body(request)
        if err is not None:
            return err
        device = body.get("device")
        if device is not None and not isinstance(device, str):
            return _error(400, "device must be a string such as cuda:0")
        if body.get("worker") is not None:
            return _error(400, "worker cards are predicted by the sidecar (POST /api/predict); "
                               "here only this ComfyUI's own devices")
        return await _answer_own_device(body, device)


async def _answer(body: dict[str, Any], snap: Any) -> Any:
    """The prediction for ``body`` on ``snap`` (400 for a workflow or option the scan refuses)."""
    web = _web()
    try:
        answer = await asyncio.to_thread(_predict_sync, body, snap)
    except ValueError as exc:
        return _error(400, str(exc))
    return web.json_response(answer)


async def _answer_own_device(body: dict[str, Any], device: str | None) -> Any:
    """The prediction on one of this process's own devices (404 for a device it does not have)."""
    try:
        snap = await asyncio.to_thread(_own_snapshot, device)
    except ValueError as exc:
        return _error(404, str(exc))
    return await _answer(body, snap)


def _find_card(cards: list[dict[str, Any]], worker: str, device: str) -> dict[str, Any] | None:
    for c in cards:
        if str(c.get("worker")) == worker and str(c.get("device")) == device:
            return c
    return None


def add_sidecar_routes(app: Any, card_snapshots: Callable[[], list[dict[str, Any]]]) -> None:
    """Add ``GET /api/snapshot`` and ``POST /api/predict`` to the sidecar's aiohttp app.

    ``card_snapshots()`` returns the worker cards' latest heartbeat figures: dicts with ``worker``,
    ``device``, ``total_gib``, ``free_gib``, ``kind``, ``uuid``, ``simulated`` (and optionally
    ``ram_free_gib``, ``commit_used_gib``, ``commit_limit_gib``, ``name``, ``platform``).
    """
    web = _web()

    def _card(worker: Any, device: Any):
        if not isinstance(worker, str) or not isinstance(device, str) or not worker or not device:
            return None, _error(400, "name both worker and device (strings), e.g. {\"worker\": \"gpu-box\", "
                                     "\"device\": \"cuda:0\"}")
        cards = card_snapshots() or []
        card = _find_card(cards, worker, device)
        if card is None:
            known = ", ".join(f"{c.get('worker')}/{c.get('device')}" for c in cards) or "none"
            return None, _error(404, f"no card {worker}/{device}; known cards: {known}")
        from .snapshot import snapshot_from_card

        return snapshot_from_card(card), None

    async def snapshot(request: web.Request) -> web.Response:
        q = request.query
        if "worker" in q:
            snap, err = _card(q.get("worker"), q.get("device"))
            if err is not None:
                return err
            return web.json_response({"snapshot": snap.to_dict()})
        try:
            payload = await asyncio.to_thread(_snapshots_payload, q.get("device"))
        except ValueError as exc:
            return _error(404, str(exc))
        from .snapshot import snapshot_from_card

        payload["cards"] = [snapshot_from_card(c).to_dict() for c in (card_snapshots() or [])]
        return web.json_response(payload)

    async def predict(request: web.Request) -> web.Response:
        body, err = await _read_body(request)
        if err is not None:
            return err
        worker, device = body.get("worker"), body.get("device")
        if worker is not None:
            snap, err = _card(worker, device)
            if err is not None:
                return err
            return await _answer(body, snap)
        if device is not None and not isinstance(device, str):
            return _error(400, "device must be a string such as cuda:0")
        return await _answer_own_device(body, device)

    app.router.add_get("/api/snapshot", snapshot)
    app.router.add_post("/api/predict", predict)
    try:  # describe the routes in the sidecar's OpenAPI document when it keeps one
        from ..server import openapi
    except ImportError:
        openapi = None
    if openapi is not None and openapi.OPENAPI_KEY in app:
        for path, item in OPENAPI_PATHS.items():
            for method, op in item.items():
                openapi.describe(app, method, path, op)


_ERROR = {"description": "bad input", "content": {"application/json": {"schema": {
    "type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}}}}

# OpenAPI 3 path items for the sidecar's predictor routes (merged into GET /api/openapi.json).
OPENAPI_PATHS: dict[str, Any] = {
    "/api/snapshot": {"get": {
        "summary": "Memory snapshot of this machine's devices, or of one worker card",
        "parameters": [
            {"name": "device", "in": "query", "schema": {"type": "string"}, "description": "e.g. cuda:0"},
            {"name": "worker", "in": "query", "schema": {"type": "string"}, "description": "a worker's card"},
        ],
        "responses": {"200": {"description": "{snapshot, snapshots, cards} or {snapshot} for a card"},
                      "400": _ERROR, "404": _ERROR},
    }},
    "/api/predict": {"post": {
        "summary": "Seed 001 success rate of a ComfyUI workflow on a device",
        "requestBody": {"required": True, "content": {"application/json": {"schema": {
            "type": "object", "required": ["workflow"], "additionalProperties": False,
            "properties": {
                "workflow": {"type": "object", "description": "UI or API format workflow"},
                "platform": {"type": "string", "description": "nvidia, intel or a configured name"},
                "worker": {"type": "string"}, "device": {"type": "string"},
                "options": {"type": "object", "additionalProperties": False, "properties": {
                    "weight_bytes": {"type": "boolean"}, "topology": {"type": "boolean"},
                    "activation_overhead": {}, "calibration": {}}},
                "snapshot": {"type": "object", "description": "figures that replace the measured ones"},
            }}}}},
        "responses": {"200": {"description": "{p_success, level, color, label, explanation, models, snapshot, "
                                             "scan, warnings, simulated, complete}"},
                      "400": _ERROR, "404": _ERROR, "413": _ERROR},
    }},
}
