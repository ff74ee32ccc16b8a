"""HTTP routes of the predictor (the library is ``predictor/``; docs/predictor.md).

- On the sidecar (``add_sidecar_routes``): ``GET /api/snapshot`` and ``POST /api/predict``; a body
  naming ``worker`` + ``device`` uses that worker card's heartbeat figures, otherwise this machine's.
- Inside ComfyUI: ``server/comfy/predictor_routes.py`` serves the same two routes with the body check
  and the answers of this module (``read_predict_body``, ``answer``, ``answer_own_device``).

Errors are ``{"error": "<what to fix>"}`` with a 4xx status. The work runs in a thread so a slow
disk never stalls the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from ....common.errors import ApiError
from ....constants import MAX_REQUEST_BODY_BYTES

log = logging.getLogger("xpufleet")




def _web() -> Any:
    from aiohttp import web  # lazy: importing the predictor costs no aiohttp (ComfyUI start-up)

    return web


def json_errors_decorator() -> Any:
    from ....common.http import json_errors

    return json_errors


async def read_predict_body(request: Any) -> dict[str, Any]:
    """The ``POST .../predict`` body validated by its contract (:class:`~...contracts.misc.PredictRequest`;
    ApiError 400/413 naming what to fix): the body as sent, which the predictor reads."""
    from ....common.http import read_json
    from ...contracts.misc import PredictRequest
    from ...run.requests import parse_body

    body = await read_json(request, max_bytes=MAX_REQUEST_BODY_BYTES)  # (ComfyUI's server caps no body)
    parse_body(PredictRequest, body)
    return body


def _predict_sync(body: dict[str, Any], snapshot) -> dict[str, Any]:
    from ....predictor.service import apply_override, predict_workflow

    snap = apply_override(snapshot, body.get("snapshot"))
    return predict_workflow(body["workflow"], snap, platform=body.get("platform"), options=body.get("options"),
                            prompt=body.get("prompt"))


def _own_snapshot(device: str | None):
    from ....predictor.snapshot import take_snapshot

    return take_snapshot(device, import_torch=False)


def _snapshots_payload(device: str | None) -> dict[str, Any]:
    from ....predictor.snapshot import default_device, take_snapshots

    snaps = take_snapshots(import_torch=False)
    chosen = _own_snapshot(device or default_device(snaps))
    return {"snapshot": chosen.to_dict(), "snapshots": [s.to_dict() for s in snaps]}


async def own_snapshots(device: str | None) -> dict[str, Any]:
    try:
        return await asyncio.to_thread(_snapshots_payload, device)
    except ValueError as exc:
        raise ApiError(404, str(exc)) from None


async def answer(body: dict[str, Any], snap: Any) -> Any:
    """The prediction for ``body`` on ``snap`` (400 for a workflow or option the scan refuses)."""
    try:
        result = await asyncio.to_thread(_predict_sync, body, snap)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from None
    return _web().json_response(result)


async def answer_own_device(body: dict[str, Any], device: str | None) -> Any:
    """The prediction on one of this process's own devices (404 for a device it does not have)."""
    try:
        snap = await asyncio.to_thread(_own_snapshot, device)
    except ValueError as exc:
        raise ApiError(404, str(exc)) from None
    return await answer(body, snap)


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
    json_errors = json_errors_decorator()

    def _card(worker: Any, device: Any) -> Any:
        if not isinstance(worker, str) or not isinstance(device, str) or not worker or not device:
            raise ApiError(400, "name both worker and device (strings), e.g. {\"worker\": \"gpu-box\", "
                                "\"device\": \"cuda:0\"}")
        cards = card_snapshots() or []
        card = _find_card(cards, worker, device)
        if card is None:
            known = ", ".join(f"{c.get('worker')}/{c.get('device')}" for c in cards) or "none"
            raise ApiError(404, f"no card {worker}/{device}; known cards: {known}")
        from ....predictor.snapshot import snapshot_from_card

        return snapshot_from_card(card)

    @json_errors
    async def snapshot(request: Any) -> Any:
        q = request.query
        if "worker" in q:
            return _web().json_response({"snapshot": _card(q.get("worker"), q.get("device")).to_dict()})
        payload = await own_snapshots(q.get("device"))
        from ....predictor.snapshot import snapshot_from_card

        payload["cards"] = [snapshot_from_card(c).to_dict() for c in (card_snapshots() or [])]
        return _web().json_response(payload)

    from ...contracts.misc import PredictRequest
    from .. import openapi

    @json_errors
    async def predict(request: Any) -> Any:
        body = await read_predict_body(request)
        if body.get("worker") is not None:
            return await answer(body, _card(body["worker"], body.get("device")))
        return await answer_own_device(body, body.get("device"))

    setattr(predict, openapi.BODY_ATTR, openapi.BodySpec(PredictRequest))  # read_predict_body validates with it
    app.router.add_get("/api/snapshot", snapshot)
    app.router.add_post("/api/predict", predict)

    if openapi.OPENAPI_KEY in app:  # describe the routes in the sidecar's OpenAPI document
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
        "summary": "The success rate (P_success) of a ComfyUI workflow on a device (docs/predictor.md)",
        "responses": {"200": {"description": "{p_success (null: a model file is missing), level, color, label, "
                                             "explanation, models, snapshot, scan, warnings, simulated, complete, "
                                             "missing, summary}"},
                      "400": _ERROR, "404": _ERROR, "413": _ERROR},
    }},
}
