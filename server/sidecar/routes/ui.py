"""The standalone page (docs/comfyui.md): the front end of ``web/`` served by the sidecar at ``/``, and its login.

Routes:

* ``GET /``: the page (``web/standalone/index.html``); ``GET /ui/<path>``: the files of ``web/`` it
  loads (ES modules, CSS, the vendored chart library), nothing else (no dot files, no ``..``, only the
  suffixes in ``STATIC_TYPES``). They carry no data: the page asks ``/api/...`` for everything, with a
  bearer token like any client. A strict Content-Security-Policy goes with every file.
* ``POST /api/ui/login-links`` (needs the server's session token, so only someone who can read
  ``$XPUFLEET_HOME/runtime.json``): a one-time login key and the URL ``http://HOST:PORT/#login=KEY``;
  ``xpufleet ui`` asks for it and prints the URL.
* ``POST /api/ui/session`` ``{"login": KEY}`` (no token: the key is the credential): spends the key
  (once, within ``LOGIN_TTL_S``) and answers a browser session token; ``DELETE /api/ui/session`` ends
  the session that sends it.

Why a key in the URL fragment and a bearer token in ``sessionStorage`` rather than a cookie: cookies do
not keep ports apart, so a cookie set by ``127.0.0.1:8765`` goes to every other server on
``127.0.0.1`` (``SameSite=Strict`` treats all ports of one host as the same site), and any local
program listening on another port would receive the session from the browser. ``sessionStorage`` is
per origin (scheme, host and port) and per tab, a fragment is never sent to a server, never logged and
never in a Referer, and a bearer header is never added by the browser on its own, so no other page can
make requests with it (no CSRF). The page reads the fragment, removes it from the address bar and
trades the key for the session token. Sessions live in memory: a sidecar restart ends them (run
``xpufleet ui`` again).
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from ....common.errors import ApiError
from ....common.secrets import new_secret
from ...contracts.misc import Login
from .. import auth, openapi
from .common import Body, body, no_body, require_session_token

WEB_ROOT = Path(__file__).resolve().parents[3] / "web"
# ComfyUI's locales folder of the plugin: the page reads its texts from <lang>/main.json (docs/i18n.md)
LOCALES_ROOT = Path(__file__).resolve().parents[3] / "locales"
INDEX = "standalone/index.html"
LOGIN_TTL_S = 300.0  # a printed login link works once, within five minutes
SESSION_TTL_S = 24 * 3600.0  # a browser session: one working day
MAX_LIVE = 1000  # keys or sessions kept at once; the oldest go first
STATIC_TYPES = {
    ".html": "text/html", ".mjs": "text/javascript", ".js": "text/javascript", ".css": "text/css",
    ".svg": "image/svg+xml", ".json": "application/json",
}
SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
                                "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
                                "form-action 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
LOGIN_PATH = "/api/ui/login-links"
SESSION_PATH = "/api/ui/session"


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


@dataclass
class Secrets:
    """Live secrets by SHA-256 digest (the secrets themselves are never kept) with their expiry.

    A lookup compares digests, so its timing says nothing about the secret."""

    ttl_s: float
    live: dict[str, float] = field(default_factory=dict)

    def issue(self, prefix: str, now: float | None = None) -> tuple[str, float]:
        now = time.time() if now is None else now
        self._expire(now)
        while len(self.live) >= MAX_LIVE:
            self.live.pop(next(iter(self.live)))
        secret = new_secret(prefix)
        expires = now + self.ttl_s
        self.live[_digest(secret)] = expires
        return secret, expires

    def valid(self, secret: str, now: float | None = None) -> bool:
        expires = self.live.get(_digest(secret))
        return expires is not None and expires > (time.time() if now is None else now)

    def spend(self, secret: str, now: float | None = None) -> bool:
        """True once for a live secret; it is gone afterwards."""
        expires = self.live.pop(_digest(secret), None)
        return expires is not None and expires > (time.time() if now is None else now)

    def revoke(self, secret: str) -> bool:
        return self.live.pop(_digest(secret), None) is not None

    def _expire(self, now: float) -> None:
        for key in [k for k, exp in self.live.items() if exp <= now]:
            del self.live[key]


@dataclass
class UiLogins:
    """The one-time login keys and the browser sessions of one sidecar (in memory)."""

    keys: Secrets = field(default_factory=lambda: Secrets(LOGIN_TTL_S))
    sessions: Secrets = field(default_factory=lambda: Secrets(SESSION_TTL_S))


UI_KEY = web.AppKey("xpufleet_ui_logins", UiLogins)


routes = web.RouteTableDef()


def _file_response(path: Path) -> web.FileResponse:
    resp = web.FileResponse(path, headers=SECURITY_HEADERS)
    resp.content_type = STATIC_TYPES[path.suffix]
    return resp


@routes.get("/")
async def index(request: web.Request) -> web.StreamResponse:
    path = WEB_ROOT / INDEX
    if not path.is_file():
        raise ApiError(404, f"the standalone page is not installed ({path} is missing)")
    return _file_response(path)


def static_path(root: Path, rel: str) -> Path:
    """The file ``rel`` names inside ``root``; ApiError 404 for anything else (pure but for stat)."""
    parts = rel.split("/")
    if not rel or "\x00" in rel or any(p in ("", ".", "..") or p.startswith(".") for p in parts):
        raise ApiError(404, f"no file /ui/{rel}")
    path = (root / rel).resolve()
    try:
        path.relative_to(root.resolve())
    except ValueError:
        raise ApiError(404, f"no file /ui/{rel}") from None
    if path.suffix not in STATIC_TYPES or not path.is_file():
        raise ApiError(404, f"no file /ui/{rel}")
    return path


@routes.get("/ui/locales/{lang}/main.json")  # before /ui/{path}: from locales/, not web/
async def locale(request: web.Request) -> web.StreamResponse:
    """``GET /ui/locales/<lang>/main.json``: the texts of the page, the file ComfyUI reads too."""
    return _file_response(static_path(LOCALES_ROOT, f"{request.match_info['lang']}/main.json"))


@routes.get("/ui/{path:.+}")
async def static(request: web.Request) -> web.StreamResponse:
    return _file_response(static_path(WEB_ROOT, request.match_info["path"]))


@routes.get("/favicon.ico")
async def favicon(request: web.Request) -> web.StreamResponse:
    return _file_response(static_path(WEB_ROOT, "standalone/icon.svg"))


@routes.post(LOGIN_PATH)
@no_body
async def login_link(request: web.Request) -> web.Response:
    require_session_token(request, "a login link", "xpufleet ui")
    key, expires = request.app[UI_KEY].keys.issue("xfl")
    url = f"{request.scheme}://{request.host}/#login={key}"
    return web.json_response({"url": url, "login": key, "expires_at": expires}, status=201)


@routes.post(SESSION_PATH)
@body(Login)
async def open_session(request: web.Request, sent: Body[Login]) -> web.Response:
    key = sent.model.login
    logins = request.app[UI_KEY]
    if not logins.keys.spend(key):
        raise ApiError(403, "this login link was already used or has expired: run `xpufleet ui` for a new one")
    session, expires = logins.sessions.issue("xfu")
    return web.json_response({"session": session, "expires_at": expires}, status=201)


@routes.delete(SESSION_PATH)
async def close_session(request: web.Request) -> web.Response:
    given = auth.bearer_token(request)
    if given is None or not request.app[UI_KEY].sessions.revoke(given):
        raise ApiError(401, "send the session to end as 'Authorization: Bearer <session>'")
    return web.json_response({"ended": True})


def setup(app: web.Application) -> None:
    """Add the page, its files and the login routes to the sidecar ``app``."""
    logins = UiLogins()
    app[UI_KEY] = logins
    auth.add_exemption(app, SESSION_PATH)  # the login key (POST) or the session itself (DELETE)
    auth.add_bearer_check(app, logins.sessions.valid)
    app.add_routes(routes)
    _describe(app)


def _describe(app: web.Application) -> None:
    err = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    ops = {
        ("get", "/"): {"summary": "the standalone page (Runs, Workers, capsule, graph drop zone)",
                       "responses": {"200": {"description": "text/html"}}},
        ("get", "/favicon.ico"): {"summary": "the page's icon (SVG)", "responses": {"200": {"description": "image/svg+xml"}}},
        ("get", "/ui/{path}"): {"summary": "the page's files (web/)",
                                "parameters": [{"name": "path", "in": "path", "required": True,
                                                "schema": {"type": "string"}}],
                                "responses": {"200": {"description": "a file"}, "404": {"description": "no such file", **err}}},
        ("get", "/ui/locales/{lang}/main.json"): {
            "summary": "the page's texts in one language (the plugin's ComfyUI locales file)",
            "parameters": [{"name": "lang", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": {"description": "application/json"}, "404": {"description": "no such language", **err}}},
        ("post", LOGIN_PATH): {
            "summary": "a one-time login link for the standalone page (needs the session token)",
            "responses": {"201": {"description": "{url, login, expires_at}"},
                          "400": {"description": "bad body", **err}, "403": {"description": "not the session token", **err}}},
        ("post", SESSION_PATH): {
            "summary": "trade a login key (once) for a browser session token",
            "responses": {"201": {"description": "{session, expires_at}"}, "400": {"description": "bad body", **err},
                          "403": {"description": "used or expired key", **err}}},
        ("delete", SESSION_PATH): {"summary": "end this browser session",
                                   "responses": {"200": {"description": "{ended: true}"},
                                                 "401": {"description": "no such session", **err}}},
    }
    for (method, path), op in ops.items():
        openapi.describe(app, method, path, op)
