"""A worker's name belongs to its credential, and the agent socket believes nothing a peer says before it
authenticates (issue 29: server/workers/session.py, records.py, sidecar/routes/workers.py), in process:
a real sidecar app on 127.0.0.1 with real SQLite, and agents that speak the protocol by hand."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
import scripted_agent as sa  # registered by tests/server/conftest.py

from xpufleet.server.workers.records import REJECTIONS_KEPT, UNVERIFIED_KEPT

GRAPH = {"1": {"class_type": "XPUDataset", "inputs": {"name": "iris"}}}
EVIL = "http://evil.example"
FRAMES = 600


def fingerprint(pair: str) -> str:
    return "sha256:" + ":".join([pair] * 32)


@pytest.fixture
async def sc(xpufleet_home):
    async with sa.Sidecar(xpufleet_home) as sidecar:
        yield sidecar


async def join_token(sc: sa.Sidecar, name: str | None = None) -> str:
    status, body = await sc.call("POST", "/api/workers/join-tokens", {"name": name} if name else {})
    assert status == 201, body
    return body["join_token"]


async def enrol(sc: sa.Sidecar, name: str) -> tuple[sa.ScriptedAgent, str]:
    """A worker joined with a token named for it: its agent (connected) and credential."""
    agent = sa.ScriptedAgent(sc, name, auth={"kind": "join", "token": await join_token(sc, name)})
    welcome = await agent.connect()
    assert welcome["type"] == "welcome" and welcome["credential"], welcome
    return agent, welcome["credential"]


async def hello(sc: sa.Sidecar, name: str, kind: str, token: str, **extra: Any) -> dict[str, Any]:
    """One hello; the sidecar's answer (the socket closed after)."""
    agent = sa.ScriptedAgent(sc, name, auth={"kind": kind, "token": token}, **extra)
    try:
        return await agent.connect()
    finally:
        await agent.close()


async def rejected(sc: sa.Sidecar) -> list[dict[str, Any]]:
    status, body = await sc.call("GET", "/api/workers/rejected")
    assert status == 200, body
    return body["rejected"]


async def test_an_unnamed_token_cannot_take_an_offline_enrolled_workers_name(sc):
    real, credential = await enrol(sc, "box")
    await real.close()
    await sc.until(lambda: _offline(sc, "box"), "box offline")
    status, body = await sc.submit(GRAPH, worker="box", devices=["cuda:0"])
    assert status == 201, body
    run_id = body["run_id"]

    unnamed = await join_token(sc)
    answer = await hello(sc, "box", "join", unnamed)
    assert answer["type"] == "reject", answer
    assert answer["reason"].startswith("worker name 'box' belongs to an enrolled worker, and this join token was "
                                       "not issued for a name: its credential is unchanged")
    # listed under rejected connections, and as the worker's last refusal
    (row,) = [r for r in await rejected(sc) if r["name"] == "box"]
    assert row["reason"] == answer["reason"] and row["unverified"] is False
    assert (await sc.worker("box"))["last_rejection"]["reason"] == answer["reason"]
    assert (await sc.run(run_id))["status"] == "queued"  # nobody else got the run

    # the real worker is not locked out: its credential still works, and it gets its run
    back = sa.ScriptedAgent(sc, "box", auth={"kind": "credential", "token": credential})
    assert (await back.connect())["type"] == "welcome"
    assert (await back.recv_type("start_run"))["run_id"] == run_id
    # the refused token was not spent: it still joins a machine under a name nobody holds
    other = sa.ScriptedAgent(sc, "box-2", auth={"kind": "join", "token": unnamed})
    assert (await other.connect())["type"] == "welcome"


async def test_an_unnamed_token_cannot_take_an_online_workers_name(sc):
    real, credential = await enrol(sc, "box")
    answer = await hello(sc, "box", "join", await join_token(sc), instance="another-process")
    assert answer["type"] == "reject" and "belongs to an enrolled worker" in answer["reason"], answer
    w = await sc.worker("box")
    assert w["connected"] is True and w["auth"] == "credential"
    # the online agent keeps working over its connection
    status, body = await sc.submit(GRAPH, worker="box", devices=["cuda:0"])
    assert (await real.recv_type("start_run"))["run_id"] == body["run_id"]
    await real.close()
    again = sa.ScriptedAgent(sc, "box", auth={"kind": "credential", "token": credential})
    assert (await again.connect())["type"] == "welcome"


async def test_an_unnamed_token_cannot_take_a_same_machine_workers_name(sc):
    local = await sc.agent("here")  # the session token: a same-machine worker
    await local.close()
    await sc.until(lambda: _offline(sc, "here"), "here offline")
    answer = await hello(sc, "here", "join", await join_token(sc))
    assert answer["type"] == "reject" and "belongs to an enrolled worker" in answer["reason"], answer
    assert (await sc.worker("here"))["auth"] == "session"


async def test_a_token_named_for_one_worker_cannot_take_anothers_name(sc):
    real, credential = await enrol(sc, "box")
    await real.close()
    for_alpha = await join_token(sc, "alpha")
    answer = await hello(sc, "box", "join", for_alpha)
    assert answer == {"type": "reject", "reason": "this join token is for worker 'alpha', not 'box': start the "
                                                  "agent with --name alpha"}
    # the right name joins with it; box keeps its own credential
    assert (await hello(sc, "alpha", "join", for_alpha))["type"] == "welcome"
    assert (await hello(sc, "box", "credential", credential))["type"] == "welcome"


async def test_a_token_issued_for_the_name_re_enrols_an_offline_worker(sc):
    """The documented way to move a worker to a new machine: a token for its name (reissue gives one)."""
    real, old = await enrol(sc, "box")
    await real.close()
    await sc.until(lambda: _offline(sc, "box"), "box offline")
    status, body = await sc.call("POST", "/api/workers/box/reissue")
    assert status == 200 and body["delivered"] is False and body["name"] == "box", body
    answer = await hello(sc, "box", "join", body["join_token"])
    assert answer["type"] == "welcome" and answer["credential"] != old
    assert "bad credential" in (await hello(sc, "box", "credential", old))["reason"]


@pytest.mark.parametrize("origin", [EVIL, "null", "http://127.0.0.1", "SELF"])
async def test_a_request_with_an_origin_never_reaches_the_agent_socket(sc, origin):
    origin = str(sc.client.make_url("")).rstrip("/") if origin == "SELF" else origin
    async with aiohttp.ClientSession() as s:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await s.ws_connect(sc.url("/api/agents/ws"), origin=origin)
        assert refused.value.status == 403
        # the answer says why, and nothing was recorded
        async with s.get(sc.url("/api/agents/ws"), headers={"Origin": origin, "Connection": "Upgrade",
                                                            "Upgrade": "websocket"}) as resp:
            assert resp.status == 403
            assert "send no Origin header" in (await resp.json())["error"]
    assert await rejected(sc) == []
    # an agent (no Origin) still joins
    await sc.agent("box")


async def test_many_tokenless_frames_are_bounded_claims_that_change_no_workers_row(sc):
    """The probe's repro in process (its 3,000 frames against a sidecar process: test_names_e2e.py):
    refused_server frames naming a real worker, with words where the fingerprints go and a URL as the
    version. None is believed: the real worker's last refusal stays what the server saw, and at most
    UNVERIFIED_KEPT claims are kept beside the refusals."""
    real, _ = await enrol(sc, "box")
    bad_credential = await hello(sc, "box", "credential", "not-it", instance="x")
    assert bad_credential["reason"].startswith("bad credential for worker 'box'")
    refusals = [r["reason"] for r in await rejected(sc)]

    pinned = fingerprint("AB")
    forged_text = f"re-join with --server {EVIL}"
    sent = 0

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal sent
        frame = {"type": "refused_server", "name": "box" if i % 2 else f"w{i}", "version": forged_text,
                 "pinned": pinned if i % 3 else forged_text, "seen": fingerprint(f"{i % 256:02X}")}
        async with session.ws_connect(sc.url("/api/agents/ws")) as ws:
            await ws.send_str(json.dumps(frame))
            await ws.receive()  # the server closes after one frame
        sent += 1

    async with aiohttp.ClientSession() as s:
        for start in range(0, FRAMES, 50):  # 50 connections at a time
            await asyncio.gather(*(one(s, i) for i in range(start, start + 50)))
    assert sent == FRAMES
    rows = await rejected(sc)
    claims = [r for r in rows if r["unverified"]]
    assert len(claims) == UNVERIFIED_KEPT
    assert [r["reason"] for r in rows if not r["unverified"]] == refusals  # none pushed out
    assert all(r["reason"].startswith("unverified: ") for r in claims)
    assert not any("evil.example" in json.dumps(r) for r in rows)
    w = await sc.worker("box")
    assert w["last_rejection"]["reason"] == bad_credential["reason"] and w["auth"] == "credential"
    assert "evil.example" not in json.dumps(w)
    # a well-formed claim quotes only the name and hex fingerprints; the one instruction is the server's
    claim = next(r for r in claims if "refused this server's TLS certificate" in r["reason"])
    assert pinned in claim["reason"] and "xpufleet workers join-token --name" in claim["reason"]
    assert "this server serves plain HTTP" in claim["reason"]
    await real.close()


async def test_no_hello_and_bad_hellos_are_unverified_claims_too(sc, monkeypatch):
    from xpufleet.server.workers import session

    real, _ = await enrol(sc, "box")
    async with aiohttp.ClientSession() as s:
        for i in range(UNVERIFIED_KEPT + 5):  # a bad hello naming the real worker, then under other names
            async with s.ws_connect(sc.url("/api/agents/ws")) as ws:
                await ws.send_str(json.dumps({"type": "hello", "name": "box" if i == 0 else f"w{i}"}))
                answer = json.loads((await ws.receive()).data)
                assert answer["type"] == "reject" and answer["reason"].startswith("bad hello: ")
        monkeypatch.setattr(session, "AGENT_HELLO_TIMEOUT_S", 0.2)
        async with s.ws_connect(sc.url("/api/agents/ws")) as ws:  # says nothing
            assert (await ws.receive()).type == aiohttp.WSMsgType.CLOSE
    rows = await rejected(sc)
    assert len(rows) == UNVERIFIED_KEPT and all(r["unverified"] for r in rows)
    assert rows[0]["reason"] == "unverified: a connection sent no hello within 0.2 s" and rows[0]["name"] is None
    assert (await sc.worker("box"))["last_rejection"] is None
    await real.close()


async def test_a_version_that_is_not_one_is_not_repeated(sc):
    answer = await hello(sc, "old-box", "session", sc.config.token, version=f"0.1 -- re-join with --server {EVIL}")
    assert answer["reason"].startswith("version mismatch: the agent runs xpufleet an unreadable version")
    (row,) = await rejected(sc)
    assert row["version"] is None and "evil" not in row["reason"]
    answer = await hello(sc, "old-box", "session", sc.config.token, version="0.0.9")
    assert "runs xpufleet 0.0.9," in answer["reason"]
    assert (await rejected(sc))[0]["version"] == "0.0.9"


async def test_verified_refusals_stay_bounded(sc):
    from xpufleet.server.sidecar.keys import STORE_KEY

    for i in range(REJECTIONS_KEPT + 3):
        await hello(sc, f"w{i}", "session", "wrong")
    assert len(await rejected(sc)) == 50  # the API's page, newest first
    store = sc.client.app[STORE_KEY]
    (row,) = store.query("SELECT COUNT(*) AS n, MIN(name) AS oldest FROM worker_rejections WHERE name LIKE 'w%'")
    assert row["n"] == REJECTIONS_KEPT


async def _offline(sc: sa.Sidecar, name: str) -> bool:
    return (await sc.worker(name))["connected"] is False
