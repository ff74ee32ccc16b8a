"""An in-process sidecar (aiohttp test server on 127.0.0.1, real SQLite) and an agent that speaks the
WebSocket protocol by hand: fast tests of what the sidecar does with what agents say.

Test files use it as ``import scripted_agent as sa`` (tests/server/conftest.py registers it).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from aiohttp.test_utils import TestClient, TestServer

from xpufleet.constants import AGENT_CAP_MEMORY, AGENT_PROTOCOL, VERSION
from xpufleet.server.sidecar.app import SidecarConfig, create_app


def cards(n: int = 2, total: float = 24.0, free: float = 24.0, prefix: str = "GPU-sa", simulated: bool = True,
          kind: str = "cuda") -> list[dict[str, Any]]:
    """A CPU and ``n`` cards with their heartbeat figures."""
    out = [{"name": "cpu", "kind": "cpu", "total_gib": 8.0, "free_gib": 6.0, "simulated": False}]
    for i in range(n):
        name = "mps:0" if kind == "mps" else f"cuda:{i}"
        out.append({"name": name, "kind": kind, "uuid": None if kind == "mps" else f"{prefix}-{i}",
                    "total_gib": total, "free_gib": free, "simulated": simulated})
    return out


class Sidecar:
    """An in-process sidecar and an HTTP client with its session token. ``async with Sidecar(home)`` starts it;
    leaving the block (also through a failed assert) stops the server, then closes the agents that connected
    to it (a stop with agents connected, as in production). A test that restarts it on the same home calls
    ``close()`` first (it may be called again)."""

    def __init__(self, home: Any, local_devices: list[dict[str, Any]] | None = None, **config: Any) -> None:
        self.config = SidecarConfig(home=home, port=0, local_devices=local_devices or [{"name": "cpu", "kind": "cpu"}],
                                    **config)
        self.client = TestClient(TestServer(create_app(self.config), host="127.0.0.1"),
                                 headers={"Authorization": f"Bearer {self.config.token}"})
        self.agents: list[ScriptedAgent] = []

    async def __aenter__(self) -> Sidecar:
        await self.client.start_server()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def close(self) -> None:
        """Stop the client and the server, then close the agents that connected."""
        await self.client.close()
        for agent in self.agents:
            await agent.close()

    @property
    def dispatcher(self) -> Any:
        from xpufleet.server.sidecar.keys import DISPATCHER_KEY

        return self.client.app[DISPATCHER_KEY]

    def url(self, path: str) -> str:
        return str(self.client.make_url(path))

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        async with self.client.request(method, path, json=body) as resp:
            return resp.status, await resp.json()

    async def submit(self, graph: dict[str, Any], **target: Any) -> tuple[int, Any]:
        return await self.call("POST", "/api/runs", {"graph": graph, "options": {"target": target}})

    async def run(self, run_id: str) -> dict[str, Any]:
        status, body = await self.call("GET", f"/api/runs/{run_id}")
        assert status == 200, body
        return body

    async def worker(self, name: str) -> dict[str, Any]:
        status, body = await self.call("GET", f"/api/workers/{name}")
        assert status == 200, body
        return body

    async def until(self, check: Any, what: str, timeout: float = 10.0) -> Any:
        """Poll an async ``check()`` until it returns something truthy (the sidecar has no push for these)."""
        deadline = asyncio.get_running_loop().time() + timeout
        while True:
            got = await check()
            if got:
                return got
            if asyncio.get_running_loop().time() > deadline:
                raise AssertionError(f"not within {timeout} s: {what}")
            await asyncio.sleep(0.02)

    async def reason(self, run_id: str, text: str, timeout: float = 10.0) -> dict[str, Any]:
        """Wait until the queued run's waiting_reason contains ``text``."""
        async def check() -> Any:
            run = await self.run(run_id)
            return run if text in (run["waiting_reason"] or "") else None
        return await self.until(check, f"run {run_id} waiting_reason with {text!r}", timeout)

    async def status(self, run_id: str, statuses: set[str], timeout: float = 10.0) -> dict[str, Any]:
        async def check() -> Any:
            run = await self.run(run_id)
            return run if run["status"] in statuses else None
        return await self.until(check, f"run {run_id} in {statuses}", timeout)

    async def share(self, worker: str, *devices: str, mode: str = "shared") -> None:
        for dev in devices:
            status, body = await self.call("PUT", f"/api/workers/{worker}/devices/{dev}/mode", {"mode": mode})
            assert status == 200, body

    async def agent(self, name: str, devices: list[dict[str, Any]] | None = None, share: tuple[str, ...] = (),
                    **hello: Any) -> ScriptedAgent:
        """A :class:`ScriptedAgent` connected and welcomed, its cards ``share`` then turned shared by memory."""
        agent = ScriptedAgent(self, name, devices, **hello)
        welcome = await agent.connect()
        assert welcome["type"] == "welcome", welcome
        await self.share(name, *share)
        return agent


class ScriptedAgent:
    """Speaks the agent protocol by hand (what an agent of another version would send, too)."""

    def __init__(self, sidecar: Sidecar, name: str, devices: list[dict[str, Any]] | None = None,
                 caps: bool = True, **hello: Any) -> None:
        from xpufleet.nodes import NODE_CLASS_MAPPINGS

        self.sidecar = sidecar
        self.name = name
        self.devices = devices if devices is not None else cards()
        self.hello = {
            "type": "hello", "name": name, "version": VERSION, "protocol": AGENT_PROTOCOL,
            "auth": {"kind": "session", "token": sidecar.config.token},
            "node_types": sorted(NODE_CLASS_MAPPINGS), "devices": self.devices, "env": {"hostname": "test"},
            "runs": [], **hello,
        }
        if caps:
            self.hello["capabilities"] = [AGENT_CAP_MEMORY]
        self.session: aiohttp.ClientSession | None = None
        self.ws: Any = None
        self.seq: dict[str, int] = {}

    async def connect(self) -> dict[str, Any]:
        """Open the socket and send the hello; the sidecar's answer (welcome or reject). The sidecar closes
        this agent when it stops."""
        self.sidecar.agents.append(self)
        self.session = aiohttp.ClientSession()
        self.ws = await self.session.ws_connect(self.sidecar.url("/api/agents/ws"))
        await self.ws.send_str(json.dumps(self.hello))
        return await self.recv()

    async def recv(self, timeout: float = 10.0) -> dict[str, Any]:
        msg = await asyncio.wait_for(self.ws.receive(), timeout)
        assert msg.type == aiohttp.WSMsgType.TEXT, msg
        return json.loads(msg.data)

    async def recv_type(self, mtype: str, timeout: float = 10.0) -> dict[str, Any]:
        for _ in range(200):  # skip acks and other chatter
            msg = await self.recv(timeout)
            if msg["type"] == mtype:
                return msg
        raise AssertionError(f"no {mtype} message")

    async def send(self, mtype: str, **fields: Any) -> None:
        await self.ws.send_str(json.dumps({"type": mtype, **fields}))

    async def heartbeat(self, runs: list[dict[str, Any]] | None = None, **free: float) -> None:
        """A heartbeat; ``cuda_1=3.5`` sets cuda:1's free figure first."""
        for key, value in free.items():
            name = key.replace("_", ":")
            for d in self.devices:
                if d["name"] == name:
                    d["free_gib"] = value
        await self.send("heartbeat", devices=self.devices, runs=runs or [], ts=1.0)

    async def send_event(self, run_id: str, seq: int, etype: str, payload: dict[str, Any] | None = None) -> None:
        """One event of the run with ``seq`` as given (a replay after a reconnect sends seqs again)."""
        self.seq[run_id] = max(seq, self.seq.get(run_id, 0))
        await self.send("event", run_id=run_id, seq=seq, event_type=etype, payload=payload or {}, ts=1.0)

    async def event(self, run_id: str, etype: str, payload: dict[str, Any] | None = None) -> None:
        """The run's next event."""
        await self.send_event(run_id, self.next_seq(run_id), etype, payload)

    def next_seq(self, run_id: str) -> int:
        """The seq the run's next event gets."""
        return self.seq.get(run_id, 0) + 1

    async def started(self, run_id: str) -> None:
        await self.send_event(run_id, self.next_seq(run_id), "run_started", {"pid": 1})

    async def take(self, run_id: str) -> dict[str, Any]:
        """Receive the run's ``start_run`` and report it started; the start message."""
        start = await self.recv_type("start_run")
        assert start["run_id"] == run_id, start
        await self.started(run_id)
        return start

    async def finish(self, run_id: str, status: str = "succeeded", peak: dict[str, Any] | None = None,
                     **payload: Any) -> None:
        await self.send_event(run_id, self.next_seq(run_id), "run_finished", {
            "status": status, "error": payload.pop("error", None), "peak_memory": peak, "execution_facts": {},
            **payload})

    async def close(self) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self.session is not None:
            await self.session.close()


def cuda_peak(gib: float, device: str = "cuda:0") -> dict[str, Any]:
    return {"measured": True, "unit": "GiB", "kind": "cuda_max_memory_allocated", "devices": {device: gib}}


def simulated_peak(gib: float, device: str = "cuda:0") -> dict[str, Any]:
    return {"measured": False, "simulated": True, "unit": "GiB", "kind": "simulated_tensor_bytes",
            "devices": {device: gib}}


# A small iris training graph the in-process sidecar tests submit (its TrainingLoop is node "7").
IRIS_GRAPH = {
    "1": {"class_type": "XPUDataset", "inputs": {"name": "iris", "val_split": 0.2, "seed": 0}},
    "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["1", 0], "batch_size": 16}},
    "4": {"class_type": "XPUMLP", "inputs": {"hidden": "16", "dataset_info": ["1", 2]}},
    "5": {"class_type": "XPUOptimizer", "inputs": {"name": "adam", "lr": 0.01}},
    "6": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}},
    "7": {"class_type": "XPUTrainingLoop", "inputs": {"model": ["4", 0], "dataloader": ["2", 0], "optimizer": ["5", 0],
                                                     "loss": ["6", 0], "epochs": 1}},
}
