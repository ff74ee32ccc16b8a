"""The predictor's routes inside ComfyUI: ``GET {prefix}/snapshot`` and ``POST {prefix}/predict``
(docs/predictor.md), with the ComfyUI process's own allocator figures and ComfyUI's model folders.

A ``predict`` body naming ``worker`` + ``device`` uses that card's figures, asked from this machine's
sidecar through the one sidecar client (``common/client.py``) with the browser's pairing (guard.py). The
request checks and the answer are the sidecar's own (``server/sidecar/routes/predictor.py``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from ...common.errors import ApiError
from ...constants import home_dir
from ..sidecar.routes.predictor import (
    answer,
    answer_own_device,
    own_snapshots,
    read_predict_body,
)
from .guard import Access, add_route, pairing_of
from .proxy import find_sidecar, no_sidecar_message

_CARD_TIMEOUT_S = 10.0


def add_comfy_routes(routes: Any, prefix: str) -> None:
    """Register ``GET {prefix}/snapshot`` and ``POST {prefix}/predict`` on ComfyUI's RouteTableDef."""
    from aiohttp import web  # lazy: importing the plugin costs no aiohttp until ComfyUI registers routes

    # Unpaired: this machine's own prediction, computed in ComfyUI's process from the workflow sent and
    # ComfyUI's own memory figures, which the same page's ComfyUI already shows to whoever reaches it. A
    # worker's card is the fleet's: asked from the sidecar with the browser's pairing (sidecar_card).
    own = Access(paired=False, why="this machine's prediction, computed in ComfyUI's process")

    async def snapshot(request: Any) -> Any:
        return web.json_response(await own_snapshots(request.query.get("device")))

    async def predict(request: Any) -> Any:
        body = await read_predict_body(request)
        if body.get("worker") is not None:
            # A worker's card: its figures from the sidecar, the models from ComfyUI's own folders.
            card = await sidecar_card(body["worker"], body.get("device"), pairing_of(request))
            return await answer(body, card)
        return await answer_own_device(body, body.get("device"))

    add_route(routes, "GET", f"{prefix}/snapshot", snapshot, own)
    add_route(routes, "POST", f"{prefix}/predict", predict, own)


async def sidecar_card(worker: Any, device: Any, pairing: str) -> Any:
    """A worker card's snapshot, asked from this machine's sidecar (``GET /api/snapshot?worker=&device=``)
    with the browser's ``pairing`` as the bearer (the sidecar checks it); its 4xx answers pass through,
    503 when no sidecar runs or answers."""
    from ...common.client import ApiError as SidecarAnswer
    from ...common.client import Client, SidecarUnreachable
    from ...predictor.snapshot import Snapshot

    if not isinstance(worker, str) or not isinstance(device, str) or not worker or not device:
        raise ApiError(400, "name both worker and device (strings), e.g. {\"worker\": \"gpu-box\", \"device\": \"cuda:0\"}")
    home = home_dir()
    sidecar = find_sidecar(home)
    if sidecar is None:
        raise ApiError(503, no_sidecar_message(home, " (a worker's card is known to the sidecar only)"))
    client = Client(sidecar.url, pairing, timeout=_CARD_TIMEOUT_S, fingerprint=sidecar.fingerprint)
    try:  # the client is synchronous (standard library): off the event loop
        found = await asyncio.to_thread(client.request, "GET", "/api/snapshot",
                                        params={"worker": worker, "device": device})
    except SidecarUnreachable as exc:
        raise ApiError(503, no_sidecar_message(home, f" ({exc})")) from None
    except SidecarAnswer as exc:  # a refused pairing keeps its mark: the page asks to pair again
        said = exc.body if isinstance(exc.body, dict) else {}
        raise ApiError(exc.status, exc.message, {k: said[k] for k in ("pairing",) if k in said}) from None
    if not isinstance(found, dict) or not isinstance(found.get("snapshot"), dict):
        raise ApiError(503, no_sidecar_message(home, f" ({sidecar.url} answered no snapshot)"))
    names = {f.name for f in dataclasses.fields(Snapshot)}
    return Snapshot(**{k: v for k, v in found["snapshot"].items() if k in names})
