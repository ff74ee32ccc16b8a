"""The sidecar's worker registry and management API, in process, against a protocol-speaking agent.

A real sidecar app (aiohttp test server on 127.0.0.1, real SQLite) and a scripted agent that speaks
the WebSocket protocol: fast tests of hello/welcome, rejections, drain, modes, removal, join tokens,
and the replay of buffered events after a reconnect (stored once by seq).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import aiohttp
import pytest
import scripted_agent as sa  # registered by tests/server/conftest.py

from xpufleet.server.workers import protocol

GRAPH = {"1": {"class_type": "XPUDataset", "inputs": {"name": "iris"}}}


def _devices() -> list[dict[str, Any]]:
    return sa.cards(2, free=20.0, prefix="GPU-test")


@pytest.fixture
async def start_sidecar(xpufleet_home):
    """``await start_sidecar()``: a sidecar on ``xpufleet_home`` (scripted_agent.Sidecar), stopped with its
    agents when the test ends, also when it fails; a restart test closes one and starts another."""
    async with contextlib.AsyncExitStack() as started:

        async def start() -> sa.Sidecar:
            return await started.enter_async_context(sa.Sidecar(xpufleet_home))

        yield start


class ScriptedAgent(sa.ScriptedAgent):
    """The scripted agent as these tests use it: the cards of :func:`_devices`, no memory cap unless the
    hello names one, and each event's seq written out (the replay test sends seqs again)."""

    def __init__(self, sidecar: sa.Sidecar, name: str, **hello: Any) -> None:
        super().__init__(sidecar, name, _devices(), caps=False, **hello)

    event = sa.ScriptedAgent.send_event  # test_panel_view.py writes the seqs out too


async def _wait_status(sc: sa.Sidecar, run_id: str, statuses: set[str]) -> dict[str, Any]:
    cursor = 0
    for _ in range(50):
        status, body = await sc.call("GET", f"/api/runs/{run_id}/events?cursor={cursor}&wait=5")
        assert status == 200, body
        cursor = body["cursor"]
        if body["status"] in statuses:
            return (await sc.call("GET", f"/api/runs/{run_id}"))[1]
    raise AssertionError(f"run {run_id} never reached {statuses}")


async def test_hello_welcome_list_drain_mode_and_restart_persistence(start_sidecar, monkeypatch):
    # late after 1.5 s: long enough for the first reads on a loaded machine, short enough to wait for below
    monkeypatch.setenv("XPUFLEET_HEARTBEAT_INTERVAL_S", "0.5")
    sc = await start_sidecar()
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {"target": "gpu-box"}})
    assert status == 400 and "unknown worker 'gpu-box'" in body["error"]
    agent = ScriptedAgent(sc, "gpu-box")
    welcome = await agent.connect()
    assert welcome["type"] == "welcome" and welcome["runs"] == {} and welcome["name"] == "gpu-box"
    w = await sc.worker("gpu-box")
    assert w["status"] == "Online" and w["version_match"] is True and w["connected"] is True
    assert [d["name"] for d in w["devices"]] == ["cpu", "cuda:0", "cuda:1"]
    card = w["devices"][1]
    assert card["simulated"] is True and card["uuid"] == "GPU-test-0" and card["free_gib"] == 20.0
    assert card["slot_limit"] == 1 and card["slots_used"] == 0 and card["mode"] == "exclusive"
    assert w["devices"][0]["slot_limit"] == 2
    # a heartbeat changes the free figure
    devs = _devices()
    devs[1]["free_gib"] = 3.5
    await agent.send("heartbeat", devices=devs, runs=[], ts=1.0)
    for _ in range(50):
        if (await sc.worker("gpu-box"))["devices"][1]["free_gib"] == 3.5:
            break
        await asyncio.sleep(0.05)
    assert (await sc.worker("gpu-box"))["devices"][1]["free_gib"] == 3.5
    # no heartbeat for more than 3 intervals: Degraded, with the reason (polled, bounded)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 30
    while (w := await sc.worker("gpu-box"))["status"] != "Degraded" and loop.time() < deadline:
        await asyncio.sleep(0.05)
    assert w["status"] == "Degraded" and "late heartbeat" in w["status_reason"]
    assert w["heartbeat_age_s"] >= protocol.heartbeat_late_s() - 0.1
    # modes
    status, body = await sc.call("PUT", "/api/workers/gpu-box/devices/cuda:1/mode", {"mode": "shared"})
    assert status == 200 and body["mode"] == "shared"
    status, body = await sc.call("PUT", "/api/workers/gpu-box/devices/cpu/mode", {"mode": "shared"})
    assert status == 400 and "only CUDA and MPS" in body["error"]
    status, body = await sc.call("PUT", "/api/workers/gpu-box/devices/cuda:1/mode", {"mode": "half"})
    assert status == 400 and "exclusive" in body["error"]
    status, body = await sc.call("PUT", "/api/workers/gpu-box/devices/cuda:9/mode", {"mode": "shared"})
    assert status == 404 and "does not offer cuda:9" in body["error"]
    # drain: status Draining; a run for it waits with the reason
    status, body = await sc.call("POST", "/api/workers/gpu-box/drain")
    assert status == 200 and body["status"] == "Draining"
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "gpu-box", "devices": ["cuda:1"]}}})
    # cuda:1 is shared by memory now: a run there needs a budget (and an agent that caps it)
    assert status == 400 and "declares no budget" in body["error"], body
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "gpu-box", "devices": ["cuda:1"], "memory_gib": 2}}})
    assert status == 400 and "cannot cap a run's memory" in body["error"], body
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "gpu-box", "devices": ["cuda:0"]}}})
    assert status == 201
    run_id = body["run_id"]
    for _ in range(50):
        run_rec = (await sc.call("GET", f"/api/runs/{run_id}"))[1]
        if run_rec["waiting_reason"]:
            break
        await asyncio.sleep(0.05)
    assert "draining" in run_rec["waiting_reason"] and run_rec["status"] == "queued"
    status, body = await sc.call("POST", "/api/workers/gpu-box/undrain")
    assert status == 200
    start = await agent.recv_type("start_run")
    assert start["run_id"] == run_id and start["devices"] == ["cuda:0"] and start["graph"] == GRAPH
    await agent.event(run_id, 1, "run_started", {"pid": 1})
    await agent.event(run_id, 2, "run_finished", {"status": "succeeded", "error": None,
                                                  "execution_facts": {"visible_devices": ["cuda:0"]}})
    assert (await agent.recv_type("ack"))["seq"] == 2
    done = await _wait_status(sc, run_id, {"succeeded"})
    assert done["worker_id"] == "gpu-box" and done["devices"] == ["cuda:0"]
    assert done["execution_facts"]["visible_devices"] == ["cuda:0"]
    await agent.close()
    for _ in range(50):
        w = await sc.worker("gpu-box")
        if w["status"] == "Disconnected":
            break
        await asyncio.sleep(0.05)
    assert w["status"] == "Disconnected" and w["devices"][1]["last_reported"] is True
    # offline worker: a run for it waits (no 400)
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "gpu-box", "devices": ["cuda:0"]}}})
    assert status == 201, body
    status, _ = await sc.call("POST", f"/api/runs/{body['run_id']}/cancel")
    assert status == 200
    # a restarted server remembers the card's mode, but the worker must connect again (400 until then)
    await sc.close()
    sc = await start_sidecar()
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {"target": "gpu-box"}})
    assert status == 400 and "has connected since the server started" in body["error"]
    w = await sc.worker("gpu-box")
    assert w["status"] == "Disconnected" and w["connected_since_start"] is False
    assert {d["name"]: d["mode"] for d in w["devices"]}["cuda:1"] == "shared"
    agent = ScriptedAgent(sc, "gpu-box")
    await agent.connect()
    assert (await sc.worker("gpu-box"))["devices"][2]["mode"] == "shared"
    await agent.close()


async def test_node_type_difference_degrades_with_the_names(start_sidecar):
    sc = await start_sidecar()
    from xpufleet.nodes import NODE_CLASS_MAPPINGS

    types = sorted(NODE_CLASS_MAPPINGS)
    agent = ScriptedAgent(sc, "odd-box", node_types=[*types[1:], "PluginOnlyNode"])
    await agent.connect()
    w = await sc.worker("odd-box")
    assert w["status"] == "Degraded"
    assert w["node_types"] == {"match": False, "missing_on_worker": [types[0]],
                               "only_on_worker": ["PluginOnlyNode"]}
    assert types[0] in w["status_reason"] and "PluginOnlyNode" in w["status_reason"]
    await agent.close()


async def test_rejections_version_credentials_and_join_tokens(start_sidecar):
    sc = await start_sidecar()
    old = ScriptedAgent(sc, "old-box", version="0.0.1")
    msg = await old.connect()
    assert msg["type"] == "reject" and "version mismatch" in msg["reason"] and "0.0.1" in msg["reason"]
    await old.close()
    bad = ScriptedAgent(sc, "bad-box", auth={"kind": "session", "token": "nope"})
    assert "wrong session token" in (await bad.connect())["reason"]
    await bad.close()
    status, body = await sc.call("GET", "/api/workers/rejected")
    reasons = {r["name"]: r["reason"] for r in body["rejected"]}
    assert "version mismatch" in reasons["old-box"] and "wrong session token" in reasons["bad-box"]
    assert "old-box" not in {w["name"] for w in (await sc.call("GET", "/api/workers"))[1]["workers"]}
    # join token -> credential (one-time); the credential then works, a wrong one does not
    status, tok = await sc.call("POST", "/api/workers/join-tokens", {"name": "remote-1"})
    assert status == 201 and "--join" in tok["command"] and tok["join_token"] in tok["command"]
    status, body = await sc.call("POST", "/api/workers/join-tokens", {"name": "local"})
    assert status == 400 and "not 'local'" in body["error"]
    status, body = await sc.call("POST", "/api/workers/join-tokens", {"nam": "x"})
    assert status == 400 and "unknown field" in body["error"]
    wrong_name = ScriptedAgent(sc, "remote-2", auth={"kind": "join", "token": tok["join_token"]})
    assert "is for worker 'remote-1'" in (await wrong_name.connect())["reason"]
    await wrong_name.close()
    joiner = ScriptedAgent(sc, "remote-1", auth={"kind": "join", "token": tok["join_token"]})
    welcome = await joiner.connect()
    assert welcome["type"] == "welcome" and welcome["credential"]
    credential = welcome["credential"]
    again = ScriptedAgent(sc, "remote-1", auth={"kind": "join", "token": tok["join_token"]})
    assert "already used" in (await again.connect())["reason"]
    await again.close()
    # the used join token did not disturb the joined worker
    assert (await sc.worker("remote-1"))["auth"] == "credential"
    # reissue: pushed to the connected worker; the old credential stops working
    status, body = await sc.call("POST", "/api/workers/remote-1/reissue")
    assert status == 200 and body["delivered"] is True
    new_cred = (await joiner.recv_type("credential"))["credential"]
    assert new_cred != credential
    await joiner.close()
    stale = ScriptedAgent(sc, "remote-1", auth={"kind": "credential", "token": credential})
    assert "bad credential" in (await stale.connect())["reason"]
    await stale.close()
    good = ScriptedAgent(sc, "remote-1", auth={"kind": "credential", "token": new_cred})
    assert (await good.connect())["type"] == "welcome"
    # session workers have nothing to reissue
    local = ScriptedAgent(sc, "same-box")
    await local.connect()
    status, body = await sc.call("POST", "/api/workers/same-box/reissue")
    assert status == 409 and "session token" in body["error"]
    # remove: revoked, disconnected (told it was removed), runs waiting for it fail
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "remote-1", "devices": ["cuda:0"]}}})
    first = body["run_id"]
    await good.recv_type("start_run")
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "remote-1", "devices": ["cuda:0"]}}})
    waiting = body["run_id"]
    status, body = await sc.call("DELETE", "/api/workers/remote-1")
    assert status == 200 and body["failed_runs"] == [waiting] and body["interrupted_runs"] == [first]
    msg = await good.recv_type("reject")
    assert msg["removed"] is True
    await good.close()
    failed = (await sc.call("GET", f"/api/runs/{waiting}"))[1]
    assert failed["status"] == "failed" and "was removed" in failed["error"]
    assert (await sc.call("GET", f"/api/runs/{first}"))[1]["status"] == "interrupted"
    revoked = ScriptedAgent(sc, "remote-1", auth={"kind": "credential", "token": new_cred})
    assert "no credential is valid" in (await revoked.connect())["reason"]
    await revoked.close()
    status, body = await sc.call("GET", "/api/workers/remote-1")
    assert status == 404
    last = (await sc.call("GET", "/api/workers/rejected"))[1]["rejected"][0]
    assert last["name"] == "remote-1" and "no credential" in last["reason"]
    await local.close()


async def test_reconnect_replays_buffered_events_once_and_grace_interrupts(start_sidecar, monkeypatch):
    monkeypatch.setenv("XPUFLEET_WORKER_RESUME_GRACE_S", "1.0")
    sc = await start_sidecar()
    agent = ScriptedAgent(sc, "flaky")
    await agent.connect()
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "flaky", "devices": ["cuda:1", "cuda:0"]}}})
    run_id = body["run_id"]
    start = await agent.recv_type("start_run")
    assert start["devices"] == ["cuda:1", "cuda:0"]
    for seq in (1, 2, 3):
        await agent.event(run_id, seq, "progress" if seq > 1 else "run_started", {"value": seq})
    await agent.close()  # cut: seqs 4.. happen while away
    agent2 = ScriptedAgent(sc, "flaky", runs=[{"run_id": run_id, "last_seq": 6, "status": "finished"}])
    welcome = await agent2.connect()
    assert welcome["runs"] == {run_id: 3}  # what the server holds: replay from 4
    for seq in (2, 3, 4, 5):  # duplicates are stored once
        await agent2.event(run_id, seq, "progress", {"value": seq})
    await agent2.event(run_id, 6, "run_finished", {"status": "succeeded", "error": None})
    done = await _wait_status(sc, run_id, {"succeeded"})
    assert done["status"] == "succeeded"
    evs = (await sc.call("GET", f"/api/runs/{run_id}/events?limit=1000"))[1]["events"]
    child = [e for e in evs if e["type"] in ("run_started", "progress", "run_finished")]
    assert [e["payload"].get("value") for e in child[:5]] == [1, 2, 3, 4, 5]
    assert len(child) == 6
    # a second run; the worker goes away for longer than the grace: interrupted
    status, body = await sc.call("POST", "/api/runs", {"graph": GRAPH, "options": {
        "target": {"worker": "flaky", "devices": ["cuda:0"]}}})
    run2 = body["run_id"]
    await agent2.recv_type("start_run")
    await agent2.event(run2, 1, "run_started", {})
    await agent2.close()
    w = None
    for _ in range(50):
        w = await sc.worker("flaky")
        if w["status"] == "Disconnected":
            break
        await asyncio.sleep(0.02)
    assert "keep running" in w["status_reason"]
    done = await _wait_status(sc, run2, {"interrupted"})
    assert "XPUFLEET_WORKER_RESUME_GRACE_S" in done["error"]
    # back after the grace: the server tells it to forget the run
    agent3 = ScriptedAgent(sc, "flaky", runs=[{"run_id": run2, "last_seq": 9, "status": "running"}])
    welcome = await agent3.connect()
    assert welcome["runs"] == {}
    await agent3.close()


async def test_bad_hello_and_plain_http_on_the_socket(start_sidecar):
    sc = await start_sidecar()
    status, body = await sc.call("GET", "/api/agents/ws")
    assert status == 400 and "WebSocket" in body["error"]
    async with aiohttp.ClientSession() as s, s.ws_connect(sc.url("/api/agents/ws")) as ws:
        await ws.send_str(json.dumps({"type": "hello", "name": "x"}))
        msg = json.loads((await ws.receive()).data)
        assert msg["type"] == "reject" and "missing field" in msg["reason"]
    status, body = await sc.call("GET", "/api/workers/rejected")
    assert "bad hello" in body["rejected"][0]["reason"]


@pytest.mark.parametrize("path", ["/api/workers/nobody/drain", "/api/workers/nobody/reissue"])
async def test_unknown_worker_is_404(start_sidecar, path):
    sc = await start_sidecar()
    status, body = await sc.call("POST", path)
    assert status == 404 and "no worker named 'nobody'" in body["error"]
