"""The one door of every route the plugin adds to ComfyUI's server (docs/security.md): who may call it.

ComfyUI has no login, and its own Origin check lets through a request without ``Origin`` or with
``Origin: null`` (a sandboxed iframe). Whatever reaches ``/xpufleet/...`` could reach the sidecar, which
starts programs on every worker, so each route is registered through :func:`add_route` with its
:class:`Access`, and every request is checked here before its handler runs:

1. ``Host`` names this ComfyUI: a loopback name or address, ComfyUI's ``--listen`` address, (when it
   listens beyond loopback) an IP literal or this machine's name, or a name in
   ``XPUFLEET_COMFY_ALLOWED_HOSTS``. A page whose DNS name was rebound to 127.0.0.1 still sends its own
   name and is refused (403).
2. ``Origin``, when sent, is this page's own (``http(s)://`` + the Host); ``null`` is refused. A
   ``Sec-Fetch-Site`` other than ``same-origin`` or ``none`` is refused too (another port of the same
   host is ``same-site``, not ``same-origin``).
3. A request that changes something (any method but GET, HEAD, OPTIONS) carries
   ``X-XPUFleet-Request: 1`` and, with a body, ``Content-Type: application/json``: a browser sends
   neither cross-origin without a CORS preflight, which ComfyUI does not grant for this header.
4. A route that acts on the fleet needs the browser's pairing (``X-XPUFleet-Pairing: <secret>``), which
   the sidecar checks (server/sidecar/routes/pairing.py): 401 ``{"pairing": "missing"}`` without it, so
   the page asks the user to pair (web/lib/pairing.mjs). Curl on this machine has no pairing either.
"""

from __future__ import annotations

import functools
import os
import urllib.parse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ...common.errors import ApiError
from ...common.http import json_error
from ..sidecar.auth import HostPolicy, host_policy

ENV_ALLOWED_HOSTS = "XPUFLEET_COMFY_ALLOWED_HOSTS"  # extra Host names (a reverse proxy's), comma-separated
REQUEST_HEADER = "X-XPUFleet-Request"  # forces a CORS preflight (web/lib/api.mjs sends it)
PAIRING_HEADER = "X-XPUFleet-Pairing"  # the browser's pairing secret (web/lib/pairing.mjs)
PAIRING_KEY = "xpufleet_pairing"  # request[PAIRING_KEY]: the pairing secret sent, or None
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
SAME_ORIGIN_FETCH = frozenset({"same-origin", "none"})
GUARD_ATTR = "__xpufleet_access__"  # set on every guarded handler (tests enumerate ComfyUI's routes)
PAIR_HELP = ("pair this browser: paste the code `xpufleet pair` prints (or `xpufleet start` printed) into the "
             "'Pair this browser' prompt of the XPU Fleet panels, or the sidecar's token from "
             "$XPUFLEET_HOME/runtime.json")

Handler = Callable[[Any], Awaitable[Any]]


@dataclass(frozen=True)
class Access:
    """What a route asks of a request besides the checks every route gets (Host, Origin, preflight).

    ``paired``: whether it needs the browser's pairing; a callable decides per request (the proxy lets
    ``POST /xpufleet/api/pairing/redeem`` through unpaired: it is how a browser pairs). ``why``: the
    reason a route works unpaired, said in docs/security.md (required when ``paired`` is False)."""

    paired: bool | Callable[[Any], bool]
    why: str = ""

    def __post_init__(self) -> None:
        if self.paired is False and not self.why:
            raise ValueError("a route that works unpaired says why (docs/security.md)")

    def needs_pairing(self, request: Any) -> bool:
        return self.paired(request) if callable(self.paired) else bool(self.paired)


_policy: HostPolicy | None = None


def comfy_listen() -> str:
    """ComfyUI's ``--listen`` address (127.0.0.1 when not hosted, or on a ComfyUI without the option);
    several addresses count as beyond loopback when one of them is."""
    try:
        from comfy.cli_args import args  # type: ignore[import-not-found]  # ComfyUI's own options
    except Exception:
        return "127.0.0.1"
    listen = str(getattr(args, "listen", None) or "127.0.0.1")
    addresses = [a.strip() for a in listen.split(",") if a.strip()]
    from ..sidecar.auth import is_loopback_host

    beyond = [a for a in addresses if not is_loopback_host(a if ":" not in a else f"[{a}]")]
    return beyond[0] if beyond else "127.0.0.1"


def policy() -> HostPolicy:
    """The Host names this ComfyUI answers to (worked out once per process)."""
    global _policy
    if _policy is None:
        extra = [n for n in os.environ.get(ENV_ALLOWED_HOSTS, "").split(",") if n.strip()]
        listen = comfy_listen()
        _policy = host_policy(listen if ":" not in listen else f"[{listen}]", extra)
    return _policy


def check(request: Any, access: Access, host_policy_: HostPolicy | None = None) -> None:
    """Raise ApiError (403/415/401) for a request ``access`` refuses; note its pairing on the request."""
    host = request.headers.get("Host")
    if not (host_policy_ or policy()).allows(host):
        raise ApiError(403, f"Host {host!r} is not this ComfyUI's address: open ComfyUI as 127.0.0.1 or "
                            f"localhost, or name the host in {ENV_ALLOWED_HOSTS}", {"refused": "host"})
    origin = request.headers.get("Origin")
    if origin is not None:
        parsed = urllib.parse.urlsplit(origin)
        if origin.strip().lower() == "null" or parsed.scheme not in ("http", "https") or \
                parsed.netloc.lower() != (host or "").strip().lower():
            raise ApiError(403, f"requests from the origin {origin!r} are refused: only ComfyUI's own page "
                                f"may use XPU Fleet's routes", {"refused": "origin"})
    site = request.headers.get("Sec-Fetch-Site")
    if site is not None and site.lower() not in SAME_ORIGIN_FETCH:
        raise ApiError(403, f"a {site} request is refused: only ComfyUI's own page may use XPU Fleet's routes",
                       {"refused": "origin"})
    if request.method not in SAFE_METHODS:
        if request.headers.get(REQUEST_HEADER) != "1":
            raise ApiError(403, f"send '{REQUEST_HEADER}: 1' with a request that changes something (the XPU "
                                f"Fleet page does; another site's page cannot)", {"refused": "preflight"})
        has_body = (request.content_length or 0) > 0 or "chunked" in request.headers.get("Transfer-Encoding", "")
        if has_body and request.content_type != "application/json":
            raise ApiError(415, f"send the body as 'Content-Type: application/json', not "
                                f"{request.headers.get('Content-Type')!r}", {"refused": "content-type"})
    pairing = request.headers.get(PAIRING_HEADER, "").strip() or None
    request[PAIRING_KEY] = pairing
    if pairing is None and access.needs_pairing(request):
        raise ApiError(401, f"this browser is not paired with the fleet: {PAIR_HELP}", {"pairing": "missing"})


def guarded(handler: Handler, access: Access) -> Handler:
    """``handler`` behind :func:`check`, its ApiErrors (and the guard's) answered as ``{"error": ...}``."""

    @functools.wraps(handler)
    async def door(request: Any) -> Any:
        try:
            check(request, access)
            return await handler(request)
        except ApiError as exc:
            return json_error(exc.status, exc.message, exc.extra)

    setattr(door, GUARD_ATTR, access)
    return door


def add_route(routes: Any, method: str, path: str, handler: Handler, access: Access) -> None:
    """Register ``handler`` on ComfyUI's RouteTableDef behind the guard: the only way the plugin adds a route."""
    routes.route(method, path)(guarded(handler, access))


def pairing_of(request: Any) -> str:
    """The pairing secret the request sent; ApiError 401 (``pairing: missing``) without one."""
    secret = request.get(PAIRING_KEY)
    if not secret:
        raise ApiError(401, f"this browser is not paired with the fleet: {PAIR_HELP}", {"pairing": "missing"})
    return secret
