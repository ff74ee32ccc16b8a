"""A worker's name belongs to its credential, and no web page or unauthenticated peer reaches the agent
socket's state (issue 29), end to end: a real sidecar process, real agent processes with their own homes
(remote machines), simulated cards, real runs; hand-made frames from this test where the probe sent them."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import fleet_harness as fh  # registered by tests/server/conftest.py
import pytest
from fleet_harness import iris_graph

from xpufleet.server.workers.records import UNVERIFIED_KEPT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

EVIL = "http://evil.example"
FRAMES = 1000  # tokenless frames without an Origin (each its own connection and refusal record)
TAKEOVER = "worker name 'box' belongs to an enrolled worker, and this join token was not issued for a name"


def box_agent(fleet: fh.Fleet, home, *args: str, label: str = "box") -> fh.AgentProc:
    return fleet.agent("--name", "box", "--simulate", "cuda:0=16", *args, env=fleet.env(home), label=label)


def token(fleet: fh.Fleet, name: str | None = None) -> str:
    out = fleet.cli("workers", "join-token", *(("--name", name) if name else ()), "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout)["join_token"]


def refusals(sc: fh.SidecarProc, text: str) -> list[dict]:
    return [r for r in sc.rejected() if text in r["reason"]]


def wait_refused(sc: fh.SidecarProc, text: str, timeout: float = 90.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = refusals(sc, text)
        if found:
            return found[0]
        time.sleep(0.2)  # the rejected list has no push channel: bounded poll
    raise AssertionError(f"no refusal with {text!r}: {sc.rejected()}")


def test_an_unnamed_token_never_takes_an_enrolled_workers_name_or_its_run(fleet, tmp_path):
    """The probe's repro: box joined with a token named for it and went offline; an agent with an unnamed
    token said hello as box. Now it is refused (listed under rejected connections), the run queued for box
    waits, and the real box comes back with its own credential and runs it."""
    sc = fleet.sidecar()
    box_home, thief_home = tmp_path / "box-machine", tmp_path / "other-machine"
    real = box_agent(fleet, box_home, "--server", sc.url, "--join", token(fleet, "box"))
    real.wait_connected()
    credential_file = box_home / "agents" / "box.credential.json"
    credential = json.loads(credential_file.read_text())["credential"]
    real.stop()
    sc.wait_worker("box", False, field="connected")
    run_id = sc.submit(iris_graph(1, device="cuda:0"), target={"worker": "box", "devices": ["cuda:0"]})

    unnamed = token(fleet)
    thief = box_agent(fleet, thief_home, "--server", sc.url, "--join", unnamed, label="thief")
    thief.out.wait_for("refused this agent")
    thief.stop()
    row = wait_refused(sc, TAKEOVER)
    assert row["name"] == "box" and row["unverified"] is False and "its credential is unchanged" in row["reason"]
    assert sc.worker("box")["last_rejection"]["reason"] == row["reason"]
    shown = fleet.cli("workers", "rejected")
    assert f"box from 127.0.0.1: {TAKEOVER}" in shown.stdout, shown.stdout
    assert sc.run(run_id)["status"] == "queued"  # the thief never got it
    assert not (thief_home / "agents" / "box.credential.json").exists()

    # the real worker is not locked out: same credential, and it runs the run that waited for it
    back = box_agent(fleet, box_home, "--server", sc.url, label="box-back")
    back.wait_connected()
    assert sc.wait_run(run_id, {"succeeded", "failed", "interrupted"})["status"] == "succeeded"
    assert json.loads(credential_file.read_text())["credential"] == credential

    # another try while box is online: the same refusal (not "in use"), and box stays Online
    before = len(refusals(sc, TAKEOVER))
    again = box_agent(fleet, tmp_path / "third-machine", "--server", sc.url, "--join", unnamed, label="thief2")
    again.out.wait_for("refused this agent")
    again.stop()
    assert sc.wait_worker("box", "Online")["auth"] == "credential"
    assert "belongs to an enrolled worker" in sc.worker("box")["last_rejection"]["reason"]
    assert len(refusals(sc, TAKEOVER)) == before  # one attempt, listed once at its latest time

    # a token named for another worker cannot take box's name either; with its own name it joins
    for_alpha = token(fleet, "alpha")
    wrong = box_agent(fleet, tmp_path / "alpha-machine", "--server", sc.url, "--join", for_alpha, label="alpha")
    wrong.out.wait_for("refused this agent")
    wrong.stop()
    assert wait_refused(sc, "this join token is for worker 'alpha', not 'box'")["name"] == "box"
    alpha = fleet.agent("--name", "alpha", "--simulate", "cuda:0=16", "--server", sc.url, "--join", for_alpha,
                        env=fleet.env(tmp_path / "alpha-machine"), label="alpha-ok")
    alpha.wait_connected()
    # and the unnamed token, refused twice, was never spent: it joins a new name
    fresh = fleet.agent("--name", "box-2", "--simulate", "cuda:0=16", "--server", sc.url, "--join", unnamed,
                        env=fleet.env(tmp_path / "fresh-machine"), label="box-2")
    fresh.wait_connected()
    assert sc.wait_worker("box", "Online")["connected"] is True


async def _refused_server_flood(url: str, frames: int) -> int:
    """The probe's tokenless refused_server frames, one per connection, 50 at a time; how many it sent."""
    sent = 0
    forged = f"re-join with --server {EVIL}"

    async def one(session: aiohttp.ClientSession, i: int) -> None:
        nonlocal sent
        fp = "sha256:" + ":".join([f"{i % 256:02X}"] * 32)
        frame = {"type": "refused_server", "name": "box" if i % 2 else f"w{i}", "version": forged,
                 "pinned": forged if i % 3 == 0 else fp, "seen": fp}
        async with session.ws_connect(url) as ws:
            await ws.send_str(json.dumps(frame))
            await ws.receive()
        sent += 1

    async with aiohttp.ClientSession() as s:
        for start in range(0, frames, 50):
            await asyncio.gather(*(one(s, i) for i in range(start, start + 50)))
    return sent


async def _handshakes(url: str, origins: list[str]) -> list[int]:
    """The HTTP status of a WebSocket handshake from each Origin (101 when it was accepted), 50 at a time."""
    async def one(session: aiohttp.ClientSession, origin: str) -> int:
        try:
            async with session.ws_connect(url, origin=origin):
                return 101
        except aiohttp.WSServerHandshakeError as exc:
            return exc.status

    out: list[int] = []
    async with aiohttp.ClientSession() as s:
        for start in range(0, len(origins), 50):
            out += await asyncio.gather(*(one(s, o) for o in origins[start:start + 50]))
    return out


def test_web_pages_are_refused_and_tokenless_frames_are_bounded_claims(fleet, tmp_path):
    """The probe's second repro: 3,000 tokenless refused_server frames (it sent them with an evil Origin;
    those are now refused at the handshake), and no worker's row tells the user to re-join elsewhere."""
    sc = fleet.sidecar()
    ws_url = sc.url.replace("http://", "ws://") + "/api/agents/ws"
    real = box_agent(fleet, tmp_path / "box-machine", "--server", sc.url, "--join", token(fleet, "box"))
    real.wait_connected()
    # another site, a sandboxed iframe, this server's own pages: refused at the handshake, nothing recorded
    assert asyncio.run(_handshakes(ws_url, [EVIL, "null", sc.url])) == [403, 403, 403]
    assert asyncio.run(_handshakes(ws_url, [EVIL] * 3000)) == [403] * 3000  # the probe's 3,000, from its Origin
    assert sc.rejected() == []

    # the same frames without an Origin (curl, a local program): claims, and few kept
    assert asyncio.run(_refused_server_flood(ws_url, FRAMES)) == FRAMES
    rows = sc.rejected()
    assert len(rows) == UNVERIFIED_KEPT and all(r["unverified"] for r in rows)
    assert all(r["reason"].startswith("unverified: ") for r in rows)
    w = sc.wait_worker("box", "Online")
    assert w["last_rejection"] is None
    assert "evil.example" not in json.dumps(rows) + json.dumps(w)
    shown = fleet.cli("workers", "rejected").stdout
    assert "evil.example" not in shown and "unverified: a connection that presented no credential" in shown
    # the agent that was there all along still works
    run_id = sc.submit(iris_graph(1, device="cuda:0"), target={"worker": "box", "devices": ["cuda:0"]})
    assert sc.wait_run(run_id, {"succeeded", "failed", "interrupted"})["status"] == "succeeded"
