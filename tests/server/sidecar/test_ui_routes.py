"""The standalone page's routes (server/sidecar/routes/ui.py): its files under a strict policy, and the
login: a one-time key from the session token, traded once for a browser session that works as a
bearer token and can be ended. The app runs in this process on loopback (aiohttp's test server)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from xpufleet.common.errors import ApiError
from xpufleet.server.sidecar.app import SidecarConfig, create_app
from xpufleet.server.sidecar.routes import ui

CPU = [{"name": "cpu", "kind": "cpu", "uuid": None, "total_gib": None}]


def test_secrets_are_kept_as_digests_and_spent_once():
    keys = ui.Secrets(ttl_s=10)
    key, expires = keys.issue("xfl", now=100.0)
    assert key.startswith("xfl_") and expires == 110.0
    assert key not in repr(keys.live)  # only the digest is stored
    assert keys.valid(key, now=105.0) and not keys.valid(key, now=110.0)
    assert keys.spend(key, now=105.0) and not keys.spend(key, now=105.0)  # once
    late, _ = keys.issue("xfl", now=100.0)
    assert not keys.spend(late, now=200.0)  # expired keys do not work
    assert not keys.valid("xfl_made-up")
    other, _ = keys.issue("xfu", now=0.0)
    assert keys.revoke(other) and not keys.revoke(other)


def test_secrets_keep_a_bounded_number(monkeypatch):
    monkeypatch.setattr(ui, "MAX_LIVE", 3)
    s = ui.Secrets(ttl_s=100)
    first = [s.issue("x", now=1.0)[0] for _ in range(3)]
    s.issue("x", now=1.0)
    assert len(s.live) == 3 and not s.valid(first[0], now=2.0) and s.valid(first[1], now=2.0)


@pytest.mark.parametrize("rel", ["", "../pyproject.toml", "lib/../../setup.py", ".hidden", "lib/.x.mjs",
                                 "vendor/uplot/LICENSE", "lib/nothing.mjs", "lib", "a\x00b"])
def test_static_path_serves_only_web_files(rel):
    with pytest.raises(ApiError) as err:
        ui.static_path(ui.WEB_ROOT, rel)
    assert err.value.status == 404


def test_static_path_finds_the_page_files():
    for rel in ("standalone/main.mjs", "lib/capsule.mjs", "xpufleet.css", "vendor/uplot/uPlot.esm.mjs"):
        assert ui.static_path(ui.WEB_ROOT, rel) == (ui.WEB_ROOT / rel).resolve()


def test_static_path_refuses_a_link_out_of_the_folder(tmp_path: Path):
    root = tmp_path / "web"
    root.mkdir()
    (tmp_path / "secret.js").write_text("x")
    (root / "link.js").symlink_to(tmp_path / "secret.js")
    with pytest.raises(ApiError):
        ui.static_path(root, "link.js")


def run(scenario, tmp_path: Path) -> None:
    async def main() -> None:
        config = SidecarConfig(home=tmp_path / "home", port=0, local_devices=CPU)
        async with TestClient(TestServer(create_app(config), host="127.0.0.1")) as client:
            await scenario(client, config)

    asyncio.run(main())


def test_the_page_and_its_files_carry_a_strict_policy_and_need_no_token(tmp_path):
    async def scenario(client, config):
        resp = await client.get("/")
        assert resp.status == 200 and resp.content_type == "text/html"
        text = await resp.text()
        assert "/ui/standalone/main.mjs" in text and config.token not in text
        csp = resp.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "frame-ancestors 'none'" in csp and "unsafe-inline" not in csp
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Referrer-Policy"] == "no-referrer"
        js = await client.get("/ui/lib/capsule.mjs")
        assert js.status == 200 and js.content_type == "text/javascript"
        assert (await client.get("/ui/vendor/uplot/uPlot.min.css")).content_type == "text/css"
        assert (await client.get("/favicon.ico")).content_type == "image/svg+xml"
        for bad in ("/ui/../server/sidecar/auth.py", "/ui/%2e%2e/pyproject.toml", "/ui/vendor/uplot/LICENSE"):
            r = await client.get(bad)
            assert r.status == 404 and "error" in await r.json(), bad
        # the Host check holds for the page too (DNS rebinding)
        r = await client.get("/", headers={"Host": "evil.example.com"})
        assert r.status == 403

    run(scenario, tmp_path)


def test_login_link_session_and_logout(tmp_path):
    async def scenario(client, config):
        server_auth = {"Authorization": f"Bearer {config.token}"}
        r = await client.post("/api/ui/login-links", json={})
        assert r.status == 401  # no token: the middleware
        r = await client.post("/api/ui/login-links", json={}, headers=server_auth)
        assert r.status == 201
        link = await r.json()
        key = link["login"]
        assert link["url"].endswith(f"/#login={key}") and link["url"].startswith("http://127.0.0.1:")
        r = await client.post("/api/ui/session", json={"login": "xfl_not-a-key"})
        assert r.status == 403 and "xpufleet ui" in (await r.json())["error"]
        r = await client.post("/api/ui/session", json={"login": key})
        assert r.status == 201
        session = (await r.json())["session"]
        assert session.startswith("xfu_") and session != config.token
        assert "Set-Cookie" not in r.headers  # no cookie: it would reach every port of 127.0.0.1
        r = await client.post("/api/ui/session", json={"login": key})
        assert r.status == 403  # a link works once
        ui_auth = {"Authorization": f"Bearer {session}"}
        r = await client.get("/api/runs", headers=ui_auth)
        assert r.status == 200 and (await r.json())["total"] == 0
        # a browser session cannot mint more login links
        r = await client.post("/api/ui/login-links", json={}, headers=ui_auth)
        assert r.status == 403 and "session token" in (await r.json())["error"]
        r = await client.delete("/api/ui/session", headers=ui_auth)
        assert r.status == 200
        r = await client.get("/api/runs", headers=ui_auth)
        assert r.status == 403  # ended
        r = await client.delete("/api/ui/session", headers=ui_auth)
        assert r.status == 401

    run(scenario, tmp_path)


@pytest.mark.parametrize(("body", "fragment"), [
    ({}, "send {\"login\""), ({"login": 5}, "send {\"login\""), ({"login": "k", "x": 1}, "unknown field"),
    ([], "JSON object"),
])
def test_bad_session_bodies_say_what_to_send(tmp_path, body, fragment):
    async def scenario(client, config):
        r = await client.post("/api/ui/session", json=body)
        assert r.status == 400 and fragment in (await r.json())["error"]
        r = await client.post("/api/ui/login-links", json={"ttl": 5}, headers={"Authorization": f"Bearer {config.token}"})
        assert r.status == 400 and "unknown field" in (await r.json())["error"]

    run(scenario, tmp_path)


def test_an_expired_link_does_not_log_in(tmp_path, monkeypatch):
    async def scenario(client, config):
        r = await client.post("/api/ui/login-links", headers={"Authorization": f"Bearer {config.token}"})
        key = (await r.json())["login"]
        real = ui.time.time
        monkeypatch.setattr(ui.time, "time", lambda: real() + ui.LOGIN_TTL_S + 1)
        r = await client.post("/api/ui/session", json={"login": key})
        assert r.status == 403 and "expired" in (await r.json())["error"]

    run(scenario, tmp_path)


def test_the_openapi_document_describes_the_ui_routes(tmp_path):
    async def scenario(client, config):
        doc = await (await client.get("/api/openapi.json")).json()
        assert {"post"} <= set(doc["paths"]["/api/ui/login-links"])
        assert {"post", "delete"} <= set(doc["paths"]["/api/ui/session"])

    run(scenario, tmp_path)
