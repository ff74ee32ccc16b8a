"""Worker routes of the sidecar (docs/workers.md, docs/sidecar.md): the agents' WebSocket and the management API.

``setup(app)`` (called by ``create_app``) adds:

* ``GET /api/agents/ws``: the agent WebSocket. Exempt from the session-token middleware: the agent
  authenticates in its ``hello`` (session token, worker credential or one-time join token). A request with
  an ``Origin`` header is refused (403) before the upgrade: browsers send one on every WebSocket handshake
  and agents never do, so no web page (``null``, another site or this server's own) reaches the socket.
* ``GET /api/workers`` -> ``{"workers": [...], "pools": [...], "add_worker": {...}, "this_server": {...}}``
  (every field of docs/workers.md's Workers panel; pool instances are listed with their pool; this server's own
  machine as a row of its own, never a worker),
* ``POST /api/workers/ssh`` (add an SSH worker), ``POST /api/workers/{name}/disable`` / ``/enable``,
  ``GET /api/workers/{name}``, ``POST /api/workers/{name}/drain`` / ``/undrain``,
  ``DELETE /api/workers/{name}`` (remove), ``POST /api/workers/{name}/reissue``,
  ``POST /api/workers/join-tokens``, ``GET /api/workers/rejected``,
  ``PUT /api/workers/{name}/devices/{device}/mode`` ``{"mode": "exclusive"|"shared"}``.
"""

from __future__ import annotations

import logging
from typing import Any

from aiohttp import web

from ....common.http import json_error
from ....common.runtime_file import read_runtime
from ....constants import AGENT_WS_PATH, WORKER_NAME_RE
from ...contracts.workers import DeviceMode, JoinTokenRequest, SshWorker
from ...slurm.manager import SlurmPools
from ...workers import protocol
from ...workers.registry import WorkerRegistry
from .. import auth, openapi
from ..keys import CONFIG_KEY, DISPATCHER_KEY, STORE_KEY
from .common import Body, body, no_body

log = logging.getLogger("xpufleet.workers")

REGISTRY_KEY = web.AppKey("xpufleet_workers", WorkerRegistry)


routes = web.RouteTableDef()


def _registry(request: web.Request) -> WorkerRegistry:
    return request.app[REGISTRY_KEY]


@routes.get(AGENT_WS_PATH)
async def agent_ws(request: web.Request) -> web.StreamResponse:
    """The agent's WebSocket; authentication happens in its hello. Browsers are refused first (by ``Origin``)."""
    origin = request.headers.get("Origin")
    if origin is not None:  # WebSockets are outside CORS: without this, any page the user opens could dial in
        log.warning("refused a browser's request for the agent socket from %s (Origin %.80r)", request.remote,
                    origin)
        return json_error(403, f"{AGENT_WS_PATH} is for worker agents, which send no Origin header; a web "
                               f"page's request is refused")
    # Pings find a dead agent (power loss, half-open TCP) so its runs enter the resume grace.
    ws = web.WebSocketResponse(max_msg_size=protocol.MAX_MESSAGE_BYTES,
                               heartbeat=max(10.0, 3 * protocol.heartbeat_interval_s()))
    if not ws.can_prepare(request).ok:
        return json_error(400, f"{AGENT_WS_PATH} is a WebSocket endpoint for worker agents (xpufleet agent start)")
    await ws.prepare(request)
    await _registry(request).serve(ws, request.remote)
    return ws


@routes.get("/api/workers")
async def list_workers(request: web.Request) -> web.Response:
    reg = _registry(request)
    return web.json_response({"workers": reg.list(), "pools": reg.list_pools(), "add_worker": _add_worker(request),
                              "this_server": reg.describe_this_server()})


def _add_worker(request: web.Request) -> dict[str, Any]:
    """How the Workers panel's "Add worker" opens (docs/workers.md: "via SSH" when only this machine can reach
    the server)."""
    config = request.app[CONFIG_KEY]
    if auth.is_loopback_host(config.host):
        return {"default": "ssh", "reason": f"this server listens on {config.host} only: other machines cannot "
                                            f"reach it, so a worker elsewhere is added via SSH"}
    return {"default": "join", "reason": "other machines reach this server: they join with a one-time token"
                                         + ("" if config.tls_fingerprint else " (plain HTTP: start with --tls)")}


@routes.get("/api/workers/{name}")
async def get_worker(request: web.Request) -> web.Response:
    return web.json_response(_registry(request).describe(request.match_info["name"]))


@routes.post("/api/workers/{name}/drain")
@no_body
async def drain(request: web.Request) -> web.Response:
    return web.json_response(_registry(request).set_drained(request.match_info["name"], True))


@routes.post("/api/workers/{name}/undrain")
@no_body
async def undrain(request: web.Request) -> web.Response:
    return web.json_response(_registry(request).set_drained(request.match_info["name"], False))


@routes.delete("/api/workers/{name}")
async def remove(request: web.Request) -> web.Response:
    return web.json_response(await _registry(request).remove(request.match_info["name"]))


@routes.post("/api/workers/{name}/reissue")
@no_body
async def reissue(request: web.Request) -> web.Response:
    reg = _registry(request)
    return web.json_response(await reg.reissue(request.match_info["name"], server_url(request)))


@routes.post("/api/workers/join-tokens")
@body(JoinTokenRequest, required=False)
async def join_tokens(request: web.Request, sent: Body[JoinTokenRequest]) -> web.Response:
    async with request.app[STORE_KEY].acknowledged():  # a 201 once the token is in state.db (store.py)
        out = _registry(request).join_token(sent.model.name, sent.raw.get("ttl_s"), server_url(request))
    return web.json_response(out, status=201)


@routes.post("/api/workers/ssh")
@body(SshWorker)
async def add_ssh(request: web.Request, sent: Body[SshWorker]) -> web.Response:
    reg = _registry(request)
    async with request.app[STORE_KEY].acknowledged():  # a 201 once the worker is in state.db (store.py)
        added = reg.ssh.add(sent.raw)  # its values: ssh/manager.py
    return web.json_response(reg.describe(added), status=201)


async def _switch_ssh(request: web.Request, enable: bool) -> web.Response:
    """An SSH worker's agent stopped (disable) or connected again (enable); the worker as it is then."""
    reg, name = _registry(request), request.match_info["name"]
    await (reg.ssh.enable(name) if enable else reg.ssh.disable(name))
    return web.json_response(reg.describe(name))


@routes.post("/api/workers/{name}/disable")
@no_body
async def disable(request: web.Request) -> web.Response:
    return await _switch_ssh(request, enable=False)


@routes.post("/api/workers/{name}/enable")
@no_body
async def enable(request: web.Request) -> web.Response:
    return await _switch_ssh(request, enable=True)


@routes.get("/api/workers/rejected")
async def rejected(request: web.Request) -> web.Response:
    return web.json_response({"rejected": _registry(request).rejections()})


@routes.put("/api/workers/{name}/devices/{device}/mode")
@body(DeviceMode)
async def set_mode(request: web.Request, sent: Body[DeviceMode]) -> web.Response:
    out = _registry(request).set_mode(request.match_info["name"], request.match_info["device"], sent.model.mode)
    return web.json_response(out)


def server_url(request: web.Request) -> str:
    """The URL other machines use in a join command: the one this request came to."""
    return f"{request.scheme}://{request.host}"


def tunnel_target(config: Any) -> Any:
    """Where SSH workers' tunnels end here: the agent socket, else (plain HTTP only) the TCP port."""

    def target() -> str | None:
        if config.agent_socket is not None:
            return str(config.agent_socket)
        info = read_runtime(config.home) or {}
        url = str(info.get("url") or "")
        return f"127.0.0.1:{info['port']}" if url.startswith("http://") and info.get("port") else None

    return target


def _card_snapshots(reg: WorkerRegistry) -> Any:
    """Worker cards' latest heartbeat figures, for the predictor's ``/api/snapshot``."""

    def source() -> list[dict[str, Any]]:
        out = []
        for st in reg.workers.values():
            # The worker's host RAM and commit charge (its CPU entry) go with each of its cards.
            host = next((d for d in st.devices if d["kind"] == "cpu"), {})
            for d in st.devices:
                if d["kind"] == "cpu":
                    continue
                out.append({"worker": st.name, "device": d["name"], "kind": d["kind"], "uuid": d.get("uuid"),
                            "total_gib": d.get("total_gib"), "free_gib": d.get("free_gib"),
                            "simulated": bool(d.get("simulated")), "name": d.get("label"),
                            "online": st.online, "ram_free_gib": host.get("free_gib"),
                            "commit_used_gib": host.get("commit_used_gib"),
                            "commit_limit_gib": host.get("commit_limit_gib")})
        return out

    return source


def setup(app: web.Application) -> None:
    """Add the worker routes to the sidecar ``app`` (its registry, made in app.py, under ``REGISTRY_KEY``)."""
    config = app[CONFIG_KEY]
    registry = app[REGISTRY_KEY]
    ssh = registry.ssh
    slurm = SlurmPools(registry, config.home, lambda: str((read_runtime(config.home) or {}).get("url") or "") or None)
    app[DISPATCHER_KEY].card_snapshot_sources.append(_card_snapshots(registry))
    auth.add_exemption(app, AGENT_WS_PATH)
    app.add_routes(routes)
    _describe(app)

    async def on_startup(app: web.Application) -> None:
        registry.start()
        ssh.start_all()
        slurm.start()

    async def on_shutdown(app: web.Application) -> None:
        await slurm.close()
        await ssh.close()
        await registry.close()

    app.on_startup.append(on_startup)
    app.on_shutdown.insert(0, on_shutdown)


def _describe(app: web.Application) -> None:
    """OpenAPI descriptions of the worker routes."""
    err = {"$ref": "#/components/schemas/Error"}

    def resp(desc: str, *codes: int) -> dict[str, Any]:
        out: dict[str, Any] = {"200": {"description": desc}}
        for c in codes:
            out[str(c)] = {"description": "error", "content": {"application/json": {"schema": err}}}
        return out

    name = {"name": "name", "in": "path", "required": True,
            "schema": {"type": "string", "pattern": WORKER_NAME_RE.pattern}, "description": "a worker's name"}
    device = {"name": "device", "in": "path", "required": True, "schema": {"type": "string"},
              "description": "the worker's device name, e.g. cuda:0"}
    ops = {
        ("get", AGENT_WS_PATH): {"summary": "worker agents' WebSocket (auth in the hello message)",
                                 "responses": {"101": {"description": "switching protocols"},
                                               "400": {"description": "not a WebSocket request"}}},
        ("get", "/api/workers"): {
            "summary": "every known worker with status, devices, slots and runs; the one-shot pools; how "
                       "\"Add worker\" opens",
            "description": "Each worker: name, status (Online, Degraded, Draining, Disconnected, Disabled), "
                           "status_reason, auth (session, credential, pool, ssh), version, devices, runs, "
                           "mounts [{label, folder}], one_shot, one_shot_taken, pool, ssh {host, port, "
                           "remote_dir, state, detail, pid, connects, disabled} (SSH workers), selectable "
                           "(false for Disabled workers and pool instances), confirm {remove, disable} (what "
                           "the second click does), recent_runs (the last finished ones), devices[].admission "
                           "{by: slots|memory, runs, text, ...} (how the card takes runs). pools: [{name, revoked, "
                           "idle, busy, queued, waiting [{id, name, waiting_reason, waiting_s}], instances "
                           "(each with instance_state idle|running|gone)}]. add_worker: {default: ssh|join, "
                           "reason}. this_server: this machine (target local) with its devices, runs, "
                           "recent_runs and queued, or null.",
            "responses": {"200": {"description": "the Workers data", "content": {"application/json": {"schema": {
                "type": "object", "required": ["workers", "pools", "add_worker", "this_server"],
                "properties": {"workers": {"type": "array", "items": {"type": "object"}},
                               "pools": {"type": "array", "items": {"type": "object"}},
                               "add_worker": {"type": "object"},
                               "this_server": {"type": ["object", "null"]}}}}}},
                          **{k: v for k, v in resp("", 401, 403).items() if k != "200"}}},
        ("get", "/api/workers/rejected"): {"summary": "refused agent connections with their reason",
                                           "responses": resp("{\"rejected\": [...]}", 401, 403)},
        ("post", "/api/workers/join-tokens"): {
            "summary": "a one-time join token and the command a remote machine runs",
            "responses": {"201": {"description": "{\"join_token\", \"command\", \"expires_at\"}"},
                          **{k: v for k, v in resp("", 400, 401, 403).items() if k != "200"}}},
        ("get", "/api/workers/{name}"): {"summary": "one worker", "parameters": [name],
                                         "responses": resp("the worker", 404)},
        ("delete", "/api/workers/{name}"): {
            "summary": "remove: revoke its credential, disconnect it, fail the runs waiting for it",
            "parameters": [name], "responses": resp("what was removed", 404)},
        ("post", "/api/workers/{name}/drain"): {"summary": "no new runs on this worker", "parameters": [name],
                                                "responses": resp("the worker", 400, 404)},
        ("post", "/api/workers/{name}/undrain"): {"summary": "take new runs again", "parameters": [name],
                                                  "responses": resp("the worker", 400, 404)},
        ("post", "/api/workers/{name}/reissue"): {
            "summary": "a new credential for a joined worker (the old one stops working)",
            "parameters": [name], "responses": resp("delivered, or a join token", 400, 404, 409)},
        ("post", "/api/workers/ssh"): {
            "summary": "add an SSH worker: the server reaches user@host through OpenSSH, installs xpufleet in a "
                       "folder of its own there, starts the agent and tunnels its connection back",
            "responses": {"201": {"description": "the worker"},
                          **{k: v for k, v in resp("", 400, 401, 403, 409).items() if k != "200"}}},
        ("post", "/api/workers/{name}/disable"): {
            "summary": "SSH worker: stop its agent (running runs end interrupted), end ssh; listed as Disabled",
            "parameters": [name], "responses": resp("the worker", 404, 409)},
        ("post", "/api/workers/{name}/enable"): {"summary": "SSH worker: connect it again", "parameters": [name],
                                                 "responses": resp("the worker", 404, 409)},
        ("put", "/api/workers/{name}/devices/{device}/mode"): {
            "summary": "a card's mode: exclusive (default) or shared by memory (CUDA/MPS on workers)",
            "parameters": [name, device],
            "responses": resp("the new mode", 400, 404)},
    }
    for (method, path), op in ops.items():
        openapi.describe(app, method, path, op)
