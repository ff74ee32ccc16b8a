"""The sidecar, reached from ComfyUI's own server (docs/comfyui.md): same origin for the front end, the token
kept on the server side.

Routes (registered by ``routes.register`` on ComfyUI's PromptServer):

- ``/xpufleet/api/<resource>/...`` (any method) -> the sidecar's ``/api/<resource>/...``, for the
  resources in ``FORWARDED_RESOURCES`` only (runs, workers, estimates, services, sweeps, studies; the
  sidecar's agent WebSocket, health and status are not forwarded). The query string and the JSON body
  pass through (the body read whole, ``common.http.read_body``), the answer (status, JSON, server-sent
  events, files) streams back. Only ``Content-Type``/``Accept``/``Last-Event-ID`` go up: never the
  browser's cookies or Authorization. The bearer is the browser's pairing (``X-XPUFleet-Pairing``, guard.py),
  which the sidecar checks: never the sidecar's own token, so a request from someone who has not paired
  is refused (401 ``{"pairing": "missing"}``) even from this machine. ``POST .../pairing/redeem`` (how a
  browser pairs) is the one forwarded request that needs no pairing; it carries its own credential.
- ``GET /xpufleet/sidecar``: whether a sidecar runs for this ``XPUFLEET_HOME`` (url, pid, version).
- ``POST /xpufleet/sidecar/start`` (body ``{}`` or ``{"port": N}``, 0 = any free port; default the
  CLI's): starts one on this machine when none runs (``xpufleet start``, a daemon of its own that
  outlives ComfyUI), and answers like ``GET /xpufleet/sidecar``.

With no sidecar the forwarded routes answer 503 and say how to start one. Every route is behind the
guard (guard.py: Host, Origin, preflight, pairing; docs/security.md says who can reach what).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import sys
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...common.errors import ApiError
from ...common.http import read_body, read_object
from ...common.runtime_file import pid_alive, read_runtime
from ...constants import (
    DEFAULT_PORT,
    EVENTS_LONG_POLL_MAX_S,
    MAX_REQUEST_BODY_BYTES,
    SIDECAR_LOG_NAME,
    SIDECAR_START_TIMEOUT_S,
    home_dir,
)
from .guard import PAIRING_KEY, Access, add_route

log = logging.getLogger("xpufleet")

FORWARDED_RESOURCES = ("runs", "workers", "pools", "estimates", "services", "sweeps", "studies", "pairing",
                       "pairings")
REDEEM_TAIL = "pairing/redeem"  # forwarded unpaired: how a browser pairs (server/sidecar/routes/pairing.py)
_UP_HEADERS = ("Content-Type", "Accept", "Last-Event-ID")
_DOWN_HEADERS = ("Content-Type", "Content-Disposition", "Cache-Control", "Last-Modified", "ETag",
                 "X-Accel-Buffering")
_HEALTH_TIMEOUT_S = 3.0
# A long-poll of run events may wait EVENTS_LONG_POLL_MAX_S; server-sent events keep alive far more often.
_READ_TIMEOUT_S = EVENTS_LONG_POLL_MAX_S + 30.0
_PLUGIN_PATH_DIR = "comfy-pythonpath"  # under XPUFLEET_HOME: makes `import xpufleet` find this plugin


class ProxyError(ApiError):
    """An answer of the proxy itself (not the sidecar's): status and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message)


@dataclass(frozen=True)
class Sidecar:
    """The sidecar of one ``XPUFLEET_HOME``, from its runtime file (the token never leaves this process)."""

    url: str
    token: str
    pid: int | None
    version: str | None
    fingerprint: str | None = None  # a TLS sidecar's certificate, pinned (docs/workers.md)

    def ssl(self) -> Any:
        """``ssl=`` for aiohttp: the pinned certificate, or default verification."""
        from ...common.tls import aiohttp_ssl

        return aiohttp_ssl(self.fingerprint)

    def public(self) -> dict[str, Any]:
        return {"running": True, "url": self.url, "pid": self.pid, "version": self.version}


def find_sidecar(home: Path) -> Sidecar | None:
    """The sidecar the runtime file under ``home`` names, if its process is alive (not yet asked)."""
    info = read_runtime(home)
    if info is None or not pid_alive(info.get("pid")):
        return None
    return Sidecar(str(info["url"]).rstrip("/"), str(info["token"]), info.get("pid"), info.get("version"),
                   info.get("tls_fingerprint"))


def upstream_path(raw_tail: str) -> str:
    """``/api/<tail>`` for the raw (still percent-encoded) path after ``/xpufleet/api/``; ProxyError
    404 for a resource that is not forwarded, 400 for a dot segment."""
    segments = raw_tail.split("/")
    decoded = [urllib.parse.unquote(s) for s in segments]
    if not decoded or decoded[0] not in FORWARDED_RESOURCES:
        raise ProxyError(404, f"/xpufleet/api/{decoded[0] if decoded else ''} is not forwarded to the sidecar; "
                              f"forwarded: {', '.join('/xpufleet/api/' + r for r in FORWARDED_RESOURCES)}")
    if any(s in (".", "..") or "/" in s for s in decoded):
        raise ProxyError(400, "the path may not hold '.' or '..' segments or encoded slashes")
    return "/api/" + raw_tail


def no_sidecar_message(home: Path, detail: str = "") -> str:
    return (f"no XPU Fleet sidecar is running for XPUFLEET_HOME={home}{detail}: start one with "
            f"`xpufleet start`, or POST /xpufleet/sidecar/start (the setting 'XPU Fleet: start the sidecar "
            f"when none runs' does it from the ComfyUI page)")


def parse_start_port(body: dict[str, Any]) -> int | None:
    """The port of a ``POST /xpufleet/sidecar/start`` body (None = the CLI's default); ProxyError 400."""
    port = body.get("port")
    if port is None:
        return None
    if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
        raise ProxyError(400, f"port must be an integer 0-65535 (0 = any free port), got {port!r}")
    return port


def plugin_root() -> Path:
    """This plugin's folder (the repository root ComfyUI loaded from custom_nodes/)."""
    return Path(sys.modules[__name__.split(".")[0]].__file__).resolve().parent


def sidecar_env(home: Path, root: Path | None = None) -> dict[str, str]:
    """The environment ``xpufleet start`` runs in from ComfyUI: ``XPUFLEET_HOME``, and a ``PYTHONPATH``
    that finds this plugin as ``xpufleet`` when ComfyUI's Python has no such package installed (a plugin
    cloned into custom_nodes/ is loaded by path, under another module name); the sidecar's run
    processes inherit it."""
    root = (root or plugin_root()).resolve()
    env = {**os.environ, "XPUFLEET_HOME": str(home)}
    spec = importlib.util.find_spec("xpufleet") if "xpufleet" not in sys.modules else None
    installed = sys.modules.get("xpufleet")
    origin = getattr(installed, "__file__", None) if installed is not None else getattr(spec, "origin", None)
    if origin and Path(origin).resolve().parent == root:
        return env  # `import xpufleet` already finds this very plugin
    shim = home / _PLUGIN_PATH_DIR
    shim.mkdir(parents=True, exist_ok=True)
    link = shim / "xpufleet"
    if link.is_symlink() and Path(os.readlink(link)) != root:
        link.unlink()
    if not link.exists():
        try:
            link.symlink_to(root, target_is_directory=True)
        except OSError as exc:
            raise ProxyError(500, f"cannot make {link} point at {root} ({exc}); install the plugin into "
                                  f"ComfyUI's Python instead: {sys.executable} -m pip install -e {root}") from None
    env["PYTHONPATH"] = os.pathsep.join([str(shim), *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


class SidecarProxy:
    """The handlers; one per ComfyUI process (one aiohttp client session, made on first use)."""

    def __init__(self, prefix: str) -> None:
        self.api_prefix = f"{prefix}/api/"
        self._session: Any = None
        self._start_lock: asyncio.Lock | None = None

    def _client(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=5.0, sock_read=_READ_TIMEOUT_S),
                auto_decompress=False)
        return self._session

    async def close(self, _app: Any = None) -> None:
        """Close the client session (on ComfyUI's app cleanup: its server stopping)."""
        if self._session is not None and not self._session.closed:
            await self._session.close()

    async def _alive(self, home: Path) -> Sidecar | None:
        """The sidecar when its runtime file names a live process that answers /api/health."""
        import aiohttp

        found = find_sidecar(home)
        if found is None:
            return None
        try:
            async with self._client().get(f"{found.url}/api/health", ssl=found.ssl(),
                                          timeout=aiohttp.ClientTimeout(total=_HEALTH_TIMEOUT_S)) as resp:
                return found if resp.status == 200 else None
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return None

    # -- handlers --

    async def forward(self, request: Any) -> Any:
        import aiohttp
        import yarl
        from aiohttp import web

        home = home_dir()
        # ComfyUI serves every route twice, as /xpufleet/... and /api/xpufleet/...
        _, _, raw_tail = request.rel_url.raw_path.partition(self.api_prefix)
        path = upstream_path(raw_tail)
        sidecar = find_sidecar(home)
        if sidecar is None:
            raise ProxyError(503, no_sidecar_message(home))
        body = await read_body(request, MAX_REQUEST_BODY_BYTES)
        query = request.rel_url.raw_query_string
        url = yarl.URL(sidecar.url + path + (f"?{query}" if query else ""), encoded=True)
        headers = {h: request.headers[h] for h in _UP_HEADERS if h in request.headers}
        pairing = request.get(PAIRING_KEY)
        if pairing is not None:  # the sidecar checks it (only the redeem route goes up without one)
            headers["Authorization"] = f"Bearer {pairing}"
        try:
            async with self._client().request(request.method, url, data=body or None, headers=headers,
                                              ssl=sidecar.ssl(), allow_redirects=False) as up:
                resp = web.StreamResponse(status=up.status, reason=up.reason)
                for name in _DOWN_HEADERS:
                    if name in up.headers:
                        resp.headers[name] = up.headers[name]
                if "Content-Encoding" in up.headers:
                    resp.headers["Content-Encoding"] = up.headers["Content-Encoding"]
                await resp.prepare(request)
                async for chunk in up.content.iter_any():
                    await resp.write(chunk)
                await resp.write_eof()
                return resp
        except aiohttp.ClientConnectorError:
            message = no_sidecar_message(home, f" ({sidecar.url}, named by its runtime file, does not answer)")
            raise ProxyError(503, message) from None
        except asyncio.TimeoutError:
            raise ProxyError(504, f"the sidecar at {sidecar.url} did not answer within {_READ_TIMEOUT_S:g} s") from None

    async def status(self, request: Any) -> Any:
        from aiohttp import web

        home = home_dir()
        found = await self._alive(home)
        if found is None:
            return web.json_response({"running": False, "home": str(home), "message": no_sidecar_message(home)})
        return web.json_response({**found.public(), "home": str(home)})

    async def start(self, request: Any) -> Any:
        from aiohttp import web

        home = home_dir()
        port = parse_start_port(await read_object(request, {"port"}, optional=True, max_bytes=64 * 1024))
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:  # two clicks start one sidecar
            found = await self._alive(home)
            if found is not None:
                return web.json_response({**found.public(), "home": str(home), "started": False})
            env = sidecar_env(home)
            cmd = [sys.executable, "-m", "xpufleet.server", "start", "--port",
                   str(DEFAULT_PORT if port is None else port)]
            proc = await asyncio.create_subprocess_exec(*cmd, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                        stdout=asyncio.subprocess.PIPE,
                                                        stderr=asyncio.subprocess.PIPE)
            try:
                out, err = await asyncio.wait_for(proc.communicate(), SIDECAR_START_TIMEOUT_S + 30)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                raise ProxyError(500, f"`xpufleet start` did not finish within {SIDECAR_START_TIMEOUT_S + 30:g} s; "
                                      f"see {home / SIDECAR_LOG_NAME}") from None
            found = await self._alive(home) if proc.returncode == 0 else None
            if found is None:
                said = (err or out).decode(errors="replace").strip()
                raise ProxyError(500, f"`xpufleet start` failed (exit {proc.returncode}): "
                                      f"{said or 'no message'}; see {home / SIDECAR_LOG_NAME}")
            log.info("xpufleet: started the sidecar at %s (pid %s) for %s", found.url, found.pid, home)
            return web.json_response({**found.public(), "home": str(home), "started": True})


def is_redeem(request: Any, api_prefix: str) -> bool:
    """Whether ``request`` is ``POST <api_prefix>pairing/redeem`` (the one forward that needs no pairing)."""
    _, _, tail = request.rel_url.raw_path.partition(api_prefix)
    return request.method == "POST" and tail == REDEEM_TAIL


FORWARD_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")  # GET brings HEAD


def add_proxy_routes(routes: Any, prefix: str) -> SidecarProxy:
    """Register the proxy's routes under ``prefix`` (``/xpufleet``) on ComfyUI's RouteTableDef, each
    behind the guard (guard.py)."""
    proxy = SidecarProxy(prefix)
    # Unpaired, with the Host/Origin/preflight checks: whether a sidecar runs (its url, pid, version,
    # home: nothing a local user cannot see with ps), and starting the fleet's own sidecar, a fixed
    # command (`xpufleet start`, ComfyUI's interpreter, a port at most): a page cannot pair before one runs.
    add_route(routes, "GET", f"{prefix}/sidecar", proxy.status,
              Access(paired=False, why="says whether a sidecar runs: its address, pid and version"))
    add_route(routes, "POST", f"{prefix}/sidecar/start", proxy.start,
              Access(paired=False, why="starts the fleet's own sidecar, a fixed command; the page pairs after"))
    forward = Access(paired=lambda request: not is_redeem(request, proxy.api_prefix))
    for method in FORWARD_METHODS:
        add_route(routes, method, prefix + "/api/{tail:.*}", proxy.forward, forward)
    return proxy
