"""Pairing a browser with the fleet (docs/security.md): what ComfyUI's ``/xpufleet/api/`` proxy needs from
a browser before it forwards anything (server/comfy/proxy.py forwards the browser's pairing secret as the
bearer token; this sidecar checks it like any other).

Routes:

* ``POST /api/pairing/codes`` (the server's session token only: someone who can read
  ``$XPUFLEET_HOME/runtime.json``): a one-time pairing code, valid ``PAIRING_CODE_TTL_S``;
  ``xpufleet start`` and ``xpufleet pair`` ask for one and print it.
* ``POST /api/pairing/redeem`` ``{"code": ...}`` or ``{"token": ...}``, optional ``"name"`` (no bearer:
  the code or the token is the credential): spends the code (once) or checks the token, and answers a new
  pairing's secret, shown this once (the browser keeps it in its localStorage).
* ``GET /api/pairings``: every pairing (id, name, created_at, revoked_at; never a secret).
* ``DELETE /api/pairings/{id}``: revoke one; its browser is asked to pair again.
"""

from __future__ import annotations

from aiohttp import web

from ....common.errors import ApiError
from ...contracts.pairing import PairingRedeem
from .. import auth, openapi
from ..keys import CONFIG_KEY, STORE_KEY
from ..pairing import Pairings
from .common import Body, body, no_body, require_session_token
from .ui import Secrets

PAIRING_CODE_TTL_S = 1800.0  # a printed pairing code works once, within half an hour
CODES_PATH = "/api/pairing/codes"
REDEEM_PATH = "/api/pairing/redeem"
DEFAULT_NAME = "browser"
_FLUSH_TIMEOUT_S = 30.0

PAIRINGS_KEY = web.AppKey("xpufleet_pairings", Pairings)
CODES_KEY = web.AppKey("xpufleet_pairing_codes", Secrets)

routes = web.RouteTableDef()


@routes.post(CODES_PATH)
@no_body
async def new_code(request: web.Request) -> web.Response:
    require_session_token(request, "a pairing code", "xpufleet pair")
    code, expires = request.app[CODES_KEY].issue("xfc")
    return web.json_response({"code": code, "expires_at": expires, "ttl_s": PAIRING_CODE_TTL_S}, status=201)


@routes.post(REDEEM_PATH)
@body(PairingRedeem)
async def redeem(request: web.Request, sent: Body[PairingRedeem]) -> web.Response:
    model = sent.model
    if model.token is not None:
        if not auth.token_matches(model.token, request.app[CONFIG_KEY].token):
            raise ApiError(403, "that is not the sidecar's session token: paste the token of "
                                "$XPUFLEET_HOME/runtime.json, or a code from `xpufleet pair`")
    elif not request.app[CODES_KEY].spend(model.code):
        raise ApiError(403, "this pairing code was already used or has expired: run `xpufleet pair` for a new one")
    secret, pairing = request.app[PAIRINGS_KEY].issue(model.name or DEFAULT_NAME)
    await request.app[STORE_KEY].flushed(_FLUSH_TIMEOUT_S)  # a pairing answered is a pairing kept
    return web.json_response({"pairing": secret, **pairing.public()}, status=201)


@routes.get("/api/pairings")
async def list_pairings(request: web.Request) -> web.Response:
    return web.json_response({"pairings": [p.public() for p in request.app[PAIRINGS_KEY].list()]})


@routes.delete("/api/pairings/{id}")
async def revoke(request: web.Request) -> web.Response:
    pairing_id = request.match_info["id"]
    if not request.app[PAIRINGS_KEY].revoke(pairing_id):
        raise ApiError(404, f"no live pairing {pairing_id!r}: see GET /api/pairings")
    await request.app[STORE_KEY].flushed(_FLUSH_TIMEOUT_S)
    return web.json_response({"id": pairing_id, "revoked": True})


def setup(app: web.Application) -> None:
    """The pairings of this sidecar's store, accepted as bearer tokens, and their routes."""
    pairings = Pairings(app[STORE_KEY])
    app[PAIRINGS_KEY] = pairings
    app[CODES_KEY] = Secrets(PAIRING_CODE_TTL_S)
    auth.add_exemption(app, REDEEM_PATH)  # the code or the token in the body is the credential
    auth.add_bearer_check(app, pairings.valid)
    app.add_routes(routes)
    _describe(app)


def _describe(app: web.Application) -> None:
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    ops = {
        ("post", CODES_PATH): {
            "summary": "a one-time pairing code for a browser (needs the session token)",
            "responses": {"201": {"description": "{code, expires_at, ttl_s}"},
                          "403": {"description": "not the session token", **err}}},
        ("post", REDEEM_PATH): {
            "summary": "trade a pairing code (once) or the session token for a durable pairing secret",
            "responses": {"201": {"description": "{pairing, id, name, created_at, revoked_at}"},
                          "400": {"description": "bad body", **err},
                          "403": {"description": "used or expired code, or not the token", **err}}},
        ("get", "/api/pairings"): {"summary": "every pairing (never its secret)",
                                   "responses": {"200": {"description": "{pairings: [...]}"}}},
        ("delete", "/api/pairings/{id}"): {
            "summary": "revoke a pairing",
            "parameters": [{"name": "id", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "{id, revoked: true}"},
                          "404": {"description": "no such live pairing", **err}}},
    }
    for (method, path), op in ops.items():
        openapi.describe(app, method, path, op)
