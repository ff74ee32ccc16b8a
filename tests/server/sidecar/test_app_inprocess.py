"""The sidecar application in this process (aiohttp's test server on loopback), for what a subprocess
cannot show: a machine offering cpu and mps:0 (docs/sidecar.md's exact 400 wording), and a cancel that lands
while the run's child process is being spawned."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.server.sidecar.local import LocalProvider

CPU_AND_MPS = [{"name": "cpu", "kind": "cpu", "uuid": None, "total_gib": None},
               {"name": "mps", "kind": "mps", "uuid": None, "total_gib": None}]


async def test_a_device_set_this_server_lacks_gets_the_exact_400_wording(sidecar_client):
    client, config = await sidecar_client(local_devices=CPU_AND_MPS)
    auth = {"Authorization": f"Bearer {config.token}"}
    body = {"graph": harness.iris_graph(1), "options": {"target": {"devices": ["cuda:0"]}}}
    resp = await client.post("/api/runs", json=body, headers=auth)
    assert resp.status == 400
    assert await resp.json() == {"error": "this server does not offer cuda:0 (it offers cpu, mps:0)"}
    body["options"] = {"target": {"worker": "local", "devices": ["cuda:1", "cuda:0"]}}
    resp = await client.post("/api/runs", json=body, headers=auth)
    assert (await resp.json())["error"] == "this server does not offer cuda:1, cuda:0 (it offers cpu, mps:0)"
    listing = await (await client.get("/api/runs", headers=auth)).json()
    assert listing["total"] == 0  # nothing was queued
    status = await (await client.get("/api/status", headers=auth)).json()
    assert sorted(s["label"] for s in status["slots"]) == ["cpu on this server", "mps:0 on this server"]


class RecordingHost:
    """The RunHost side of a LocalProvider: keeps what the provider reports."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.ended: tuple[str, str | None] | None = None
        self.done = asyncio.Event()

    def ingest(self, run_id: str, events: list[dict[str, Any]]) -> None:
        self.events += events
        if any(e["type"] == "run_finished" for e in events):
            self.done.set()

    def run_process_started(self, run_id: str, pid: int | None = None) -> None:
        pass

    def run_ended(self, run_id: str, status: str, error: str | None) -> None:
        self.ended = (status, error)
        self.done.set()

    def is_finished(self, run_id: str) -> bool:
        return self.done.is_set()

    def providers_changed(self) -> None:
        pass


async def test_a_cancel_while_the_child_is_being_spawned_is_not_lost(tmp_path: Path):
    """The run is registered but its process does not exist yet: the stop must still reach it."""
    host = RecordingHost()
    provider = LocalProvider(tmp_path, host, [CPU_AND_MPS[0]], stop_grace_s=20)
    run = {"id": "spawnrace", "graph": harness.iris_graph(10**6), "options": {}}
    start = asyncio.create_task(provider.start_run(run, ["cpu"]))
    for _ in range(100):  # bounded: until start_run is inside the spawn (registered, no process)
        await asyncio.sleep(0)
        if "spawnrace" in provider.runs:
            break
    group = provider.runs["spawnrace"]
    assert group.pid is None, "the cancel must land before the process exists"
    await provider.cancel("spawnrace")
    await start
    watch = provider._tasks["spawnrace"]
    await asyncio.wait_for(host.done.wait(), 90)
    await asyncio.wait_for(watch, 30)  # the child is reaped before the loop closes
    finished = [e for e in host.events if e["type"] == "run_finished"]
    assert finished, host.ended
    payload = finished[-1]["payload"]
    assert payload["status"] == "cancelled" and payload["error"] == "cancelled by request"

