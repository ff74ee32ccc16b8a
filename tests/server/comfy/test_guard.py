"""The one door of the plugin's routes on ComfyUI's server (server/comfy/guard.py, docs/security.md), on
the ComfyUI stand-in with an upstream standing for the sidecar: what a page of another origin, a sandboxed
iframe, a rebound DNS name, a simple (no-preflight) request and a client without pairing get. The real
ComfyUI and Chromium: tests/comfy_host/test_comfy_host_guard.py, tests/frontend/test_pairing_frontend.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from xpufleet.server.comfy import guard

if "comfy_test_proxy" not in sys.modules:  # the upstream stand-in and the page's headers (test folders are no packages)
    _spec = importlib.util.spec_from_file_location("comfy_test_proxy", Path(__file__).with_name("test_proxy.py"))
    sys.modules["comfy_test_proxy"] = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(sys.modules["comfy_test_proxy"])
_proxy_tests = sys.modules["comfy_test_proxy"]
JSON, PAGE_HEADERS, PAIRING = _proxy_tests.JSON, _proxy_tests.PAGE_HEADERS, _proxy_tests.PAIRING
upstream = _proxy_tests.upstream  # the fixture

SERVICE = {"name": "pwn", "program": {"command": ["sh", "-c", "touch /tmp/pwned"]}}


@pytest.fixture
async def bare(comfy_host, xpufleet_home, aiohttp_client):
    """A client of the stand-in ComfyUI with the plugin that sends no header of its own (an attacker's)."""
    instance, load = comfy_host
    load()
    return await aiohttp_client(instance.make_app())


def _host(client) -> str:
    return f"127.0.0.1:{client.port}"


ATTACKS = [  # (headers, status, refused): each shape a browser or a local program could send
    ({"Origin": "null", "Content-Type": "text/plain"}, 403, "origin"),  # sandboxed iframe, simple request
    ({"Origin": "null", **PAGE_HEADERS, **JSON}, 403, "origin"),
    ({"Origin": "http://127.0.0.2:8000", **PAGE_HEADERS, **JSON}, 403, "origin"),  # another loopback origin
    ({"Origin": "http://localhost:1", **PAGE_HEADERS, **JSON}, 403, "origin"),  # another port
    ({"Sec-Fetch-Site": "same-site", **PAGE_HEADERS, **JSON}, 403, "origin"),
    ({"Sec-Fetch-Site": "cross-site", **PAGE_HEADERS, **JSON}, 403, "origin"),
    ({"Host": "rebind.evil.example:8188", **PAGE_HEADERS, **JSON}, 403, "host"),  # DNS rebinding
    ({"Content-Type": "text/plain", "X-XPUFleet-Pairing": PAIRING}, 403, "preflight"),  # no custom header
    ({"Content-Type": "text/plain", **PAGE_HEADERS}, 415, "content-type"),
    ({"Content-Type": "application/x-www-form-urlencoded", **PAGE_HEADERS}, 415, "content-type"),
    ({"X-XPUFleet-Request": "1", **JSON}, 401, None),  # curl on this machine, without pairing
]


@pytest.mark.parametrize("path", ["/xpufleet/api/services", "/xpufleet/api/runs", "/xpufleet/api/workers/join-tokens",
                                  "/api/xpufleet/api/runs", "/xpufleet/api/pairing/codes"])
@pytest.mark.parametrize("headers,status,refused", ATTACKS)
async def test_what_another_origin_or_an_unpaired_client_sends_never_reaches_the_sidecar(
        bare, upstream, path, headers, status, refused):  # noqa: F811 - the fixture
    up, _ = upstream
    r = await bare.post(path, data=json.dumps(SERVICE).encode(), headers=headers)
    body = await r.json()
    assert r.status == status, body
    assert body.get("refused") == refused
    if status == 401:
        assert body["pairing"] == "missing" and "xpufleet pair" in body["error"]
    assert up.seen == []  # nothing reached the sidecar


async def test_the_paired_page_reaches_the_sidecar_with_its_pairing(bare, upstream):  # noqa: F811
    up, url = upstream
    headers = {"Origin": f"http://{_host(bare)}", "Sec-Fetch-Site": "same-origin", **PAGE_HEADERS, **JSON}
    r = await bare.post("/xpufleet/api/services", data=json.dumps(SERVICE).encode(), headers=headers)
    assert r.status == 201
    assert up.seen[-1]["headers"]["Authorization"] == f"Bearer {PAIRING}"
    r = await bare.get("/xpufleet/api/runs", headers={"X-XPUFleet-Pairing": PAIRING, "Host": f"localhost:{bare.port}"})
    assert r.status == 200  # a GET needs no preflight header; localhost is a loopback name


async def test_reads_need_the_pairing_too(bare, upstream):  # noqa: F811
    up, _ = upstream
    for path in ("/xpufleet/api/runs", "/xpufleet/api/workers", "/xpufleet/api/pairings"):
        r = await bare.get(path)
        assert r.status == 401 and (await r.json())["pairing"] == "missing"
    assert up.seen == []


async def test_redeeming_a_pairing_is_the_one_unpaired_forward(bare, upstream):  # noqa: F811
    up, _ = upstream
    r = await bare.post("/xpufleet/api/pairing/redeem", data=b'{"code": "xfc_x"}',
                        headers={"X-XPUFleet-Request": "1", **JSON})
    assert r.status == 403  # the upstream stand-in refuses it (no bearer); it was forwarded
    assert up.seen[-1]["path"] == "/api/pairing/redeem" and "Authorization" not in up.seen[-1]["headers"]
    # but not from another origin, and not as a simple request
    n = len(up.seen)
    for headers in ({"Origin": "null", "X-XPUFleet-Request": "1", **JSON}, {"Content-Type": "text/plain"}):
        r = await bare.post("/xpufleet/api/pairing/redeem", data=b'{"code": "xfc_x"}', headers=headers)
        assert r.status == 403
    assert len(up.seen) == n


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/xpufleet/version", None), ("GET", "/xpufleet/locales/en/main.json", None),
    ("GET", "/xpufleet/sidecar", None), ("GET", "/xpufleet/snapshot", None),
    ("POST", "/xpufleet/sidecar/start", b"{}"), ("POST", "/xpufleet/canvas/name", b'{"prompt_id": "p", "name": "n"}'),
    ("POST", "/xpufleet/predict", b"{}"), ("POST", "/xpufleet/runs/0123abcd/home", b"{}"),
])
async def test_every_route_of_the_plugin_refuses_other_origins_and_rebound_hosts(bare, method, path, body):
    for headers in ({"Origin": "null"}, {"Origin": "http://127.0.0.2:1"}, {"Host": "rebind.evil.example"},
                    {"Sec-Fetch-Site": "cross-site"}):
        r = await bare.request(method, path, data=body, headers={**headers, **PAGE_HEADERS, **JSON})
        assert r.status == 403, (method, path, headers, await r.text())
    if method == "POST":  # and a simple request (no preflight)
        r = await bare.request(method, path, data=body, headers={"Content-Type": "text/plain"})
        assert r.status == 403 and (await r.json())["refused"] == "preflight"


async def test_unpaired_routes_work_unpaired(bare):
    for path in ("/xpufleet/version", "/xpufleet/locales/en/main.json", "/xpufleet/sidecar", "/xpufleet/snapshot"):
        r = await bare.get(path)
        assert r.status == 200, (path, await r.text())


async def test_a_worker_cards_prediction_needs_the_pairing(bare):
    r = await bare.post("/xpufleet/predict", data=b'{"workflow": {"nodes": []}, "worker": "w", "device": "cuda:0"}',
                        headers={"X-XPUFleet-Request": "1", **JSON})
    body = await r.json()
    assert r.status == 401 and body["pairing"] == "missing"


async def test_every_plugin_route_on_comfyuis_server_is_behind_the_guard(comfy_host, xpufleet_home):
    """Allow-list: each route the plugin registers declares its access; an unpaired one says why."""
    instance, load = comfy_host
    load()
    app = instance.make_app()
    ours = [r for r in app.router.routes() if "/xpufleet" in (r.resource.canonical if r.resource else "")]
    assert len(ours) >= 2 * 8  # every route, and ComfyUI's /api/ twin of each
    for route in ours:
        if route.method == "HEAD":
            continue
        access = getattr(route.handler, guard.GUARD_ATTR, None)
        assert type(access).__name__ == "Access", route  # the plugin's guard, loaded as ComfyUI loads it
        assert access.paired is not False or access.why, route


def test_an_unpaired_route_must_say_why():
    with pytest.raises(ValueError, match="says why"):
        guard.Access(paired=False)


@pytest.mark.parametrize("listen,host,ok", [
    ("127.0.0.1", "127.0.0.1:8188", True), ("127.0.0.1", "localhost:8188", True), ("127.0.0.1", "[::1]:8188", True),
    ("127.0.0.1", "192.168.1.5:8188", False), ("127.0.0.1", "rebind.evil.example:8188", False),
    ("0.0.0.0", "192.168.1.5:8188", True), ("0.0.0.0", "rebind.evil.example:8188", False),
])
def test_host_names_follow_comfyuis_listen_address(listen, host, ok):
    from xpufleet.server.sidecar.auth import host_policy

    assert host_policy(listen).allows(host) is ok
