"""Browser pairings on the sidecar (server/sidecar/pairing.py, routes/pairing.py; docs/security.md): a code
that only the session token can ask for, spent once; the token pasted instead; the pairing accepted as a
bearer, listed, revocable (a revoked one answered so the page pairs again), kept across restarts."""

from __future__ import annotations

import pytest

from xpufleet.server.sidecar.pairing import Pairings, digest
from xpufleet.server.sidecar.store import Store


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def post(client, path, body, headers=None):
    r = await client.post(path, json=body, headers=headers or {})
    return r.status, await r.json()


async def test_a_code_pairs_a_browser_once(sidecar_client):
    client, config = await sidecar_client()
    status, body = await post(client, "/api/pairing/codes", {})
    assert status == 401  # no bearer at all
    status, _ = await post(client, "/api/pairing/codes", {}, bearer("xfs_wrong"))
    assert status == 403
    status, code = await post(client, "/api/pairing/codes", {}, bearer(config.token))
    assert status == 201 and code["code"].startswith("xfc_") and code["ttl_s"] == 1800
    status, paired = await post(client, "/api/pairing/redeem", {"code": code["code"], "name": "ComfyUI laptop"})
    assert status == 201 and paired["pairing"].startswith("xfp_") and paired["name"] == "ComfyUI laptop"
    status, again = await post(client, "/api/pairing/redeem", {"code": code["code"]})
    assert status == 403 and "already used" in again["error"]
    # the pairing is a bearer like the token: it reads and writes
    r = await client.get("/api/runs", headers=bearer(paired["pairing"]))
    assert r.status == 200
    # but it cannot mint codes or login links (those need the token itself)
    status, _ = await post(client, "/api/pairing/codes", {}, bearer(paired["pairing"]))
    assert status == 403
    status, _ = await post(client, "/api/ui/login-links", {}, bearer(paired["pairing"]))
    assert status == 403


async def test_the_token_pasted_pairs_and_a_wrong_one_does_not(sidecar_client):
    client, config = await sidecar_client()
    status, body = await post(client, "/api/pairing/redeem", {"token": "xfs_not-it"})
    assert status == 403 and "not the sidecar's session token" in body["error"]
    status, paired = await post(client, "/api/pairing/redeem", {"token": config.token})
    assert status == 201 and paired["name"] == "browser"
    for bad, words in (({}, "send {\"code\""), ({"code": "a", "token": "b"}, "send {\"code\""),
                       ({"code": "x", "name": "a\nb"}, "name:"), ({"code": 1}, "send {\"code\""),
                       ({"code": "x", "extra": 1}, "unknown field(s) extra")):
        status, body = await post(client, "/api/pairing/redeem", bad)
        assert status == 400 and words in body["error"], (bad, body)


async def test_a_revoked_pairing_is_told_to_pair_again(sidecar_client):
    client, config = await sidecar_client()
    _, paired = await post(client, "/api/pairing/redeem", {"token": config.token, "name": "old tab"})
    r = await client.get("/api/pairings", headers=bearer(paired["pairing"]))
    listed = (await r.json())["pairings"]
    assert [p["name"] for p in listed] == ["old tab"] and "pairing" not in listed[0]
    assert paired["pairing"] not in str(listed)
    r = await client.delete(f"/api/pairings/{paired['id']}", headers=bearer(config.token))
    assert r.status == 200
    r = await client.get("/api/runs", headers=bearer(paired["pairing"]))
    body = await r.json()
    assert r.status == 401 and body["pairing"] == "refused" and "pair it again" in body["error"]
    r = await client.delete(f"/api/pairings/{paired['id']}", headers=bearer(config.token))
    assert r.status == 404
    r = await client.get("/api/pairings", headers=bearer(config.token))
    assert (await r.json())["pairings"][0]["revoked_at"] is not None
    # a token that is not a pairing keeps its old answer
    r = await client.get("/api/runs", headers=bearer("xfs_wrong"))
    assert r.status == 403


def test_pairings_survive_a_restart_and_keep_only_a_digest(tmp_path):
    store = Store(tmp_path / "state.db")
    secret, pairing = Pairings(store).issue("kept")
    store.close()
    raw = (tmp_path / "state.db").read_bytes()
    assert secret.encode() not in raw and digest(secret).encode() in raw
    store = Store(tmp_path / "state.db")
    try:
        again = Pairings(store)
        assert again.valid(secret) and not again.valid(secret + "x")
        assert again.revoke(pairing.id) and not again.valid(secret)
    finally:
        store.close()
    store = Store(tmp_path / "state.db")
    try:
        assert not Pairings(store).valid(secret)  # revoked stays revoked
    finally:
        store.close()


@pytest.mark.parametrize("n", [3])
def test_the_oldest_live_pairing_goes_past_the_cap(tmp_path, monkeypatch, n):
    from xpufleet.server.sidecar import pairing as mod

    monkeypatch.setattr(mod, "MAX_LIVE_PAIRINGS", n)
    store = Store(tmp_path / "state.db")
    try:
        pairings = Pairings(store)
        secrets = [pairings.issue(f"p{i}", now=float(i))[0] for i in range(n + 1)]
        assert not pairings.valid(secrets[0]) and all(pairings.valid(s) for s in secrets[1:])
    finally:
        store.close()
