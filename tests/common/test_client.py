"""The one sidecar client (common/client.py): statuses, the server's error text, an unreachable sidecar,
the token sent, and the runtime file it starts from."""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from aiohttp import web

from xpufleet.common.client import ApiError, Client, SidecarUnreachable
from xpufleet.common.runtime_file import write_runtime


async def _server(aiohttp_server):
    seen: list[str | None] = []

    async def ok(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.json_response({"echo": await request.json() if request.can_read_body else None}, status=201)

    async def refused(request: web.Request) -> web.Response:
        return web.json_response({"error": "graph: missing", "field": "graph"}, status=400)

    async def text(request: web.Request) -> web.Response:
        return web.Response(text="plain failure", status=502)

    app = web.Application()
    app.router.add_post("/api/ok", ok)
    app.router.add_get("/api/refused", refused)
    app.router.add_get("/api/text", text)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/"), seen


async def test_call_gives_the_status_and_request_raises_the_servers_text(aiohttp_server):
    url, seen = await _server(aiohttp_server)
    client = Client(url, "xfs_t", timeout=10)
    status, answer = await asyncio.to_thread(client.call, "POST", "/api/ok", {"a": 1})
    assert (status, answer) == (201, {"echo": {"a": 1}}) and seen == ["Bearer xfs_t"]
    assert await asyncio.to_thread(client.call, "GET", "/api/refused") == (
        400, {"error": "graph: missing", "field": "graph"})
    with pytest.raises(ApiError) as caught:
        await asyncio.to_thread(client.request, "GET", "/api/refused")
    assert (caught.value.status, caught.value.message) == (400, "graph: missing")
    assert caught.value.body == {"error": "graph: missing", "field": "graph"}
    with pytest.raises(ApiError) as caught:
        await asyncio.to_thread(client.request, "GET", "/api/text")
    assert (caught.value.status, caught.value.message, caught.value.body) == (502, "plain failure", None)


def test_an_unreachable_sidecar_is_said_so():
    with socket.socket() as s:  # a loopback port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(SidecarUnreachable, match=f"127.0.0.1:{port} does not answer"):
        Client(f"http://127.0.0.1:{port}", None, timeout=5).health()


def test_from_home_reads_the_one_runtime_file(tmp_path):
    with pytest.raises(SidecarUnreachable, match="no sidecar is running"):
        Client.from_home(tmp_path)
    write_runtime(tmp_path, {"url": "http://127.0.0.1:9/", "token": "xfs_home", "pid": os.getpid(),
                             "tls_fingerprint": None})
    client = Client.from_home(tmp_path)
    assert (client.url, client.token) == ("http://127.0.0.1:9", "xfs_home")
