"""The /xpufleet/ proxy on ComfyUI's server (server/comfy/proxy.py): the pure rules, and the routes on the
ComfyUI stand-in forwarding to an upstream aiohttp app on loopback that records what reached it. The real
sidecar behind a real ComfyUI is tested in tests/comfy_host/test_comfy_host_proxy.py."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from xpufleet.common.runtime_file import write_runtime
from xpufleet.constants import MAX_REQUEST_BODY_BYTES
from xpufleet.server.comfy import proxy

TOKEN = "xfs_test-token"


# --- pure rules -----------------------------------------------------------------------------------


@pytest.mark.parametrize("tail,expected", [
    ("runs", "/api/runs"),
    ("runs/abc/events", "/api/runs/abc/events"),
    ("runs/abc/artifacts/checkpoints/epoch%200001.pt", "/api/runs/abc/artifacts/checkpoints/epoch%200001.pt"),
    ("workers/gpu-box/devices/cuda:0/mode", "/api/workers/gpu-box/devices/cuda:0/mode"),
    ("estimates", "/api/estimates"), ("services/chat/infer", "/api/services/chat/infer"),
    ("sweeps", "/api/sweeps"), ("studies/1", "/api/studies/1"),
])
def test_forwarded_paths(tail, expected):
    assert proxy.upstream_path(tail) == expected


@pytest.mark.parametrize("tail", ["", "agents/ws", "health", "status", "openapi.json", "snapshot", "Runs"])
def test_other_resources_are_not_forwarded(tail):
    with pytest.raises(proxy.ProxyError) as err:
        proxy.upstream_path(tail)
    assert err.value.status == 404 and "/xpufleet/api/runs" in err.value.message


@pytest.mark.parametrize("tail", ["runs/..", "runs/../agents/ws", "runs/%2e%2e/x", "runs/a%2Fb", "runs/./x"])
def test_dot_segments_and_encoded_slashes_are_refused(tail):
    with pytest.raises(proxy.ProxyError) as err:
        proxy.upstream_path(tail)
    assert err.value.status == 400


@pytest.mark.parametrize("body,port", [({}, None), ({"port": None}, None), ({"port": 0}, 0), ({"port": 9000}, 9000)])
def test_start_port(body, port):
    assert proxy.parse_start_port(body) == port


@pytest.mark.parametrize("body,words", [
    ({"port": "80"}, "integer 0-65535"), ({"port": 70000}, "integer 0-65535"), ({"port": True}, "integer"),
])
def test_bad_start_ports(body, words):
    with pytest.raises(proxy.ProxyError) as err:
        proxy.parse_start_port(body)
    assert err.value.status == 400 and words in err.value.message


def test_find_sidecar_needs_a_live_process(tmp_path):
    assert proxy.find_sidecar(tmp_path) is None
    write_runtime(tmp_path, {"url": "http://127.0.0.1:1/", "token": TOKEN, "pid": 2**22 + 12345, "version": "x"})
    assert proxy.find_sidecar(tmp_path) is None  # a stale file of a dead process
    write_runtime(tmp_path, {"url": "http://127.0.0.1:1/", "token": TOKEN, "pid": os.getpid(), "version": "x"})
    found = proxy.find_sidecar(tmp_path)
    assert found is not None and found.url == "http://127.0.0.1:1" and TOKEN not in json.dumps(found.public())


def test_sidecar_env_makes_the_plugin_importable_as_xpufleet(tmp_path):
    home = tmp_path / "home"
    repo = Path(proxy.__file__).resolve().parents[2]
    # this interpreter imports xpufleet from this very checkout: nothing to add
    env = proxy.sidecar_env(home, repo)
    assert env.get("PYTHONPATH") == os.environ.get("PYTHONPATH") and not (home / "comfy-pythonpath").exists()
    # a plugin loaded by path from elsewhere (a clone in custom_nodes/ under any folder name)
    clone = tmp_path / "custom_nodes" / "XPU-Fleet"
    clone.mkdir(parents=True)
    env = proxy.sidecar_env(home, clone)
    shim = home / "comfy-pythonpath"
    assert env["PYTHONPATH"].split(os.pathsep)[0] == str(shim) and env["XPUFLEET_HOME"] == str(home)
    assert (shim / "xpufleet").resolve() == clone.resolve()
    other = tmp_path / "elsewhere"
    other.mkdir()
    proxy.sidecar_env(home, other)  # the link follows the plugin that runs now
    assert (shim / "xpufleet").resolve() == other.resolve()


# --- the routes on the ComfyUI stand-in -----------------------------------------------------------


class Upstream:
    """An aiohttp app standing where the sidecar would: it records each request and answers."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []
        self.app = web.Application()
        self.app.router.add_route("*", "/api/{tail:.*}", self.handle)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append({"method": request.method, "path": request.rel_url.raw_path,
                          "query": request.rel_url.raw_query_string, "headers": dict(request.headers),
                          "body": body})
        if request.path == "/api/health":  # public on the sidecar too
            return web.json_response({"status": "ok"})
        if request.headers.get("Authorization") != f"Bearer {PAIRING}":
            return web.json_response({"error": "bad token"}, status=403)
        if request.path.endswith("/events/stream"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            await resp.prepare(request)
            for i in range(3):
                await resp.write(f"id: {i}\nevent: log\ndata: {{}}\n\n".encode())
                await asyncio.sleep(0)
            await resp.write_eof()
            return resp
        if request.path == "/api/runs/missing":
            return web.json_response({"error": "run missing not found"}, status=404)
        return web.json_response({"ok": True, "path": request.path}, status=201 if request.method == "POST" else 200)


@pytest.fixture
async def comfy(comfy_host, xpufleet_home, aiohttp_client):
    """A client of ComfyUI's server app (the stand-in) with the plugin loaded, on loopback (pytest-aiohttp:
    closed when the test ends, also when an assert fails)."""
    instance, load = comfy_host
    load()
    return await aiohttp_client(instance.make_app(), headers=PAGE_HEADERS)


PAIRING = "xfp_the-browsers-pairing"
# what the paired plugin page sends (server/comfy/guard.py); the upstream below takes the pairing as its token
PAGE_HEADERS = {"X-XPUFleet-Request": "1", "X-XPUFleet-Pairing": PAIRING}
JSON = {"Content-Type": "application/json"}


@pytest.fixture
async def upstream(aiohttp_client, xpufleet_home) -> tuple[Upstream, str]:
    """An :class:`Upstream` served on loopback, named in XPUFLEET_HOME's runtime file as the sidecar; its URL."""
    up = Upstream()
    url = str((await aiohttp_client(up.app)).make_url("")).rstrip("/")
    write_runtime(xpufleet_home, {"url": url, "token": TOKEN, "pid": os.getpid(), "version": "0.1.0"})
    return up, url


async def test_no_sidecar_is_a_clear_503(comfy, xpufleet_home):
    r = await comfy.get("/xpufleet/api/runs")
    assert r.status == 503
    message = (await r.json())["error"]
    assert str(xpufleet_home) in message and "xpufleet start" in message and "/xpufleet/sidecar/start" in message
    r = await comfy.get("/xpufleet/sidecar")
    assert r.status == 200 and (await r.json())["running"] is False
    # a runtime file whose server no longer answers
    write_runtime(xpufleet_home, {"url": "http://127.0.0.1:9", "token": TOKEN, "pid": os.getpid()})
    r = await comfy.post("/xpufleet/api/runs", json={"graph": {}})
    assert r.status == 503 and "does not answer" in (await r.json())["error"]
    assert (await (await comfy.get("/xpufleet/sidecar")).json())["running"] is False


async def test_forwarding_sends_the_browsers_pairing_never_the_token(comfy, upstream):
    up, url = upstream
    r = await comfy.post("/xpufleet/api/runs?x=1&y=%20a", json={"graph": {"1": {}}},
                         headers={"Authorization": "Bearer from-the-browser", "Cookie": "session=1"})
    assert r.status == 201 and (await r.json())["path"] == "/api/runs"
    seen = up.seen[-1]
    assert seen["method"] == "POST" and seen["query"] == "x=1&y=%20a"
    assert json.loads(seen["body"]) == {"graph": {"1": {}}}
    assert seen["headers"]["Authorization"] == f"Bearer {PAIRING}" and "Cookie" not in seen["headers"]
    assert "X-XPUFleet-Pairing" not in seen["headers"]
    assert seen["headers"]["Host"] == url.split("//")[1]  # the sidecar's own name, for its Host check
    # errors pass through with their status and message
    r = await comfy.get("/xpufleet/api/runs/missing")
    assert r.status == 404 and (await r.json())["error"] == "run missing not found"
    # every method; and ComfyUI's /api/... twin of every route
    for method in ("GET", "PUT", "DELETE"):
        r = await comfy.request(method, "/api/xpufleet/api/workers/box/devices/cuda:0/mode")
        assert r.status == 200 and up.seen[-1]["method"] == method
        assert up.seen[-1]["path"] == "/api/workers/box/devices/cuda:0/mode"
    # server-sent events stream through
    r = await comfy.get("/xpufleet/api/runs/abc/events/stream")
    assert r.headers["Content-Type"].startswith("text/event-stream")
    assert (await r.text()).count("event: log") == 3
    # the status route never shows the token
    r = await comfy.get("/xpufleet/sidecar")
    status = await r.json()
    assert status["running"] is True and status["url"] == url and TOKEN not in json.dumps(status)
    # not forwarded
    r = await comfy.get("/xpufleet/api/agents/ws")
    assert r.status == 404
    n = len(up.seen)
    r = await comfy.post("/xpufleet/api/runs", data=b"x" * (MAX_REQUEST_BODY_BYTES + 1), headers=JSON)
    assert r.status == 413 and len(up.seen) == n


async def test_start_refuses_bad_bodies(comfy):
    r = await comfy.post("/xpufleet/sidecar/start", json={"host": "0.0.0.0"})
    assert r.status == 400 and "unknown field(s) host" in (await r.json())["error"]
    for raw, words in ((b"[", "not valid JSON"), (b"[]", "must be a JSON object")):
        r = await comfy.post("/xpufleet/sidecar/start", data=raw, headers=JSON)
        assert r.status == 400 and words in (await r.json())["error"]


async def test_start_answers_when_one_runs(comfy, upstream):
    r = await comfy.post("/xpufleet/sidecar/start", json={"port": 0})
    body = await r.json()
    assert r.status == 200 and body["running"] is True and body["started"] is False
