"""Security of the sidecar's HTTP API (docs/limits.md).

* A session token (``secrets.token_urlsafe``), fresh at every start, written only to the runtime file
  (mode 0600): same-machine clients and agents read it there.
* Every ``/api`` route needs ``Authorization: Bearer <token>``: 401 without a token, 403 with a wrong
  one, compared in constant time (``hmac.compare_digest``). Reads need it too (run graphs, logs and
  metrics can hold paths and data other local users should not read); only ``GET /api/health`` and
  ``GET /api/openapi.json`` are public. Routes with their own credentials (worker agents) register an
  exemption with :func:`add_exemption`. Other bearer credentials (the standalone page's browser
  sessions, routes/ui.py; browser pairings, pairing.py) are accepted through :func:`add_bearer_check`.
* The ``Host`` header must name this server: a loopback name or address, or a configured name
  (``--allowed-host``, ``XPUFLEET_ALLOWED_HOSTS``); when bound to a non-loopback address, IP literals
  and the machine's hostname too. A browser page on another origin that rebinds its DNS name to
  127.0.0.1 still sends its own name, and gets 403 (DNS-rebinding defence).
* No CORS headers are ever added, so browsers keep other origins out.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from aiohttp import web

from ...common.http import json_error
from ...common.secrets import new_secret

LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})
PUBLIC_ROUTES = frozenset({("GET", "/api/health"), ("HEAD", "/api/health"), ("GET", "/api/openapi.json")})
EXEMPTIONS_KEY = web.AppKey("xpufleet_auth_exemptions", list)
BEARER_CHECKS_KEY = web.AppKey("xpufleet_auth_bearer_checks", list)
PAIRING_SECRET_START = "xfp_"  # a browser pairing's secret (pairing.py): refused, the page is asked to re-pair

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def new_token() -> str:
    """A fresh session token (256 bits)."""
    return new_secret("xfs")


def token_matches(given: str | None, expected: str) -> bool:
    """Constant-time comparison of a presented token with the expected one."""
    if given is None:
        return False
    return hmac.compare_digest(given.encode("utf-8", "surrogatepass"), expected.encode("utf-8", "surrogatepass"))


def bearer_token(request: web.Request) -> str | None:
    """The token of ``Authorization: Bearer <token>`` (None when absent or another scheme)."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


def _is_loopback_ip(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return False


def split_host(header: str) -> str:
    """The host name of a Host header value, lower case, without port or IPv6 brackets."""
    value = header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        return value.rsplit(":", 1)[0]
    return value  # a bare name, or a bare IPv6 address (invalid without brackets, but harmless)


@dataclass(frozen=True)
class HostPolicy:
    """Which Host header names this server answers to."""

    names: frozenset[str]
    allow_ip_literals: bool = False

    def allows(self, header: str | None) -> bool:
        if not header:
            return False
        host = split_host(header)
        if host in LOOPBACK_NAMES or host in self.names or _is_loopback_ip(host):
            return True
        return self.allow_ip_literals and _is_ip(host)


def is_loopback_host(bind_host: str) -> bool:
    """True when ``bind_host`` is a loopback name or address (this machine only)."""
    bound = split_host(bind_host)
    return bound in LOOPBACK_NAMES or _is_loopback_ip(bound)


def host_policy(bind_host: str, extra_names: Iterable[str] = ()) -> HostPolicy:
    """The policy for a server bound to ``bind_host`` plus configured names."""
    names = {n.strip().lower().rstrip(".") for n in extra_names if n and n.strip()}
    bound = split_host(bind_host)
    loopback = is_loopback_host(bind_host)
    if not loopback:
        names.add(bound)
        # Reached from other machines: by its IP, or by this machine's name.
        for n in (socket.gethostname(), socket.getfqdn()):
            if n:
                names.add(n.lower())
    return HostPolicy(frozenset(names), allow_ip_literals=not loopback)


def add_exemption(app: web.Application, path_prefix: str) -> None:
    """Let requests under ``path_prefix`` through without the session token (the route checks its own
    credential, e.g. a worker agent's). Call before the app starts."""
    app[EXEMPTIONS_KEY].append(path_prefix)


def add_bearer_check(app: web.Application, check: Callable[[str], bool]) -> None:
    """Accept, besides the session token, any bearer token ``check(token)`` says is valid (it must
    compare in constant time). Call before the app starts."""
    app.setdefault(BEARER_CHECKS_KEY, []).append(check)


def security_middleware(token: str, policy: HostPolicy) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Host check on every request; bearer token on every ``/api`` route that is not public."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if not policy.allows(host):
            return json_error(
                403,
                f"Host header {host!r} is not allowed: use 127.0.0.1 or localhost, or start the server "
                f"with --allowed-host NAME",
            )
        path = request.path
        if path.startswith("/api/") or path == "/api":
            public = (request.method, path) in PUBLIC_ROUTES
            exempt = any(path.startswith(p) for p in request.app.get(EXEMPTIONS_KEY, ()))
            if not public and not exempt:
                given = bearer_token(request)
                if given is None:
                    return json_error(
                        401,
                        "missing token: send 'Authorization: Bearer <token>' (the token is in "
                        "$XPUFLEET_HOME/runtime.json)",
                        headers={"WWW-Authenticate": 'Bearer realm="xpufleet"'},
                    )
                if not token_matches(given, token) and \
                        not any(check(given) for check in request.app.get(BEARER_CHECKS_KEY, ())):
                    if given.startswith(PAIRING_SECRET_START):  # a browser's pairing, revoked or unknown
                        return json_error(401, "this browser's pairing is revoked or unknown here: pair it "
                                               "again (docs/security.md)", {"pairing": "refused"})
                    return json_error(403, "wrong token: use the token of the running server's runtime.json")
        return await handler(request)

    return middleware
