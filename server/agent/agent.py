"""The worker agent (docs/architecture.md, "Workers"): a WebSocket client of the sidecar that runs runs.

It dials ``/api/agents/ws``, says ``hello`` (name, version, node types, devices, the runs it still holds)
and heartbeats with per-device total/free memory. Each run it is given runs in its own process (the
runner the sidecar uses for local runs), its cards renumbered from 0 in the order the run lists them
(``CUDA_VISIBLE_DEVICES`` / ``ZE_AFFINITY_MASK``); a crash or OOM kill ends that run only (``failed``).

A run's events carry the child's ``seq`` and stay here until the sidecar acks them: after a lost
connection the agent reconnects (common/backoff.py) and replays what the sidecar lacks. Runs keep going
while disconnected for the server's resume grace (``XPUFLEET_WORKER_RESUME_GRACE_S``, 300 s), then end
``interrupted``. A stopping agent waits for the acks of its runs' last events.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
import uuid
from typing import Any

from ...common import tls
from ...common.backoff import Backoff
from ...common.signals import cancel_and_wait
from ...constants import (
    AGENT_CAP_MEMORY,
    AGENT_HELLO_TIMEOUT_S,
    AGENT_PROTOCOL,
    AGENT_RECONNECT_MAX_S,
    RUN_STOP_GRACE_S,
    SHUTDOWN_ACK_WAIT_S,
    VERSION,
)
from ..devices import inventory as devinv
from ..run.warm import warm_up
from ..workers import protocol
from .comfyui import AgentComfy
from .config import (  # noqa: F401 - default_name, one_shot_name: the CLI's agent.default_name()
    AgentConfig,
    AuthChoice,
    AuthError,
    credential_file,
    default_name,
    one_shot_name,
    resolve_auth,
    state_file,
    unix_socket_of,
    write_private_json,
    ws_url,
)
from .instances import InstanceHost
from .parts import PartHost
from .remote import OutputsServer, RefusalReporter
from .runs import AgentRuns
from .usage import run_memory

log = logging.getLogger("xpufleet.agent")


def _bad_message(exc: Exception) -> None:
    log.warning("ignoring a bad message from the server: %s", exc)

class Agent:
    """The agent process: its connection to the sidecar, heartbeats and the state file (one asyncio event
    loop), composed of parts that own their state: the runs (runs.py), unit instances (instances.py), spread
    parts (parts.py), the outputs server and the refusal reporter (remote.py)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.inventory = devinv.Inventory(cfg.name, cfg.home, cfg.devices, cfg.simulate)
        self.ws: Any = None
        self.stopping = asyncio.Event()
        self.connected = asyncio.Event()
        self.disconnected_since: float = time.monotonic()
        self.state: dict[str, Any] = {"state": "starting"}
        self._send_lock = asyncio.Lock()
        self._node_types: list[str] | None = None
        self.removed = False
        self.instance = uuid.uuid4().hex  # this process, told apart from another agent of the same name
        # The server's settings, from its last welcome: a remote agent does not share its environment.
        self.server_heartbeat_s: float | None = None
        self.server_grace_s: float | None = None
        self._pin: str | None = None  # the certificate pinned on the current connection
        self._tasks: set[asyncio.Task[Any]] = set()
        self.last_devices: list[dict[str, Any]] | None = None  # the last inventory snapshot sent
        self.comfy = AgentComfy(cfg, self._send, self.connected.is_set)  # its ComfyUI, when given one
        self.runs = AgentRuns(cfg, self.inventory, self._send, offered=self.offered_devices,
                              resume_grace_s=self.resume_grace_s, on_change=self._runs_changed,
                              on_all_done=self.stopping.set, comfy=self.comfy)
        self.instances = InstanceHost(cfg, self._send, self.offered_devices, self._listen_host)
        self.parts = PartHost(cfg, self._send, self.offered_devices, self.inventory.simulated)
        self.outputs = OutputsServer(cfg.name, self.runs.run_dir, self._send)
        self.refusals = RefusalReporter(cfg.name)

    def offered_devices(self) -> list[dict[str, Any]]:
        """The devices this agent offers: the last snapshot sent, else a fresh probe."""
        return self.last_devices or self.inventory.snapshot()

    def _listen_host(self) -> str:
        """Where instances listen: the address this agent uses to reach the sidecar (so the sidecar, and
        the unit's other machines, reach rank 0 there); loopback when that is loopback."""
        ws = self.ws
        with contextlib.suppress(Exception):
            sock = ws.get_extra_info("sockname") if ws is not None else None
            if sock:
                return str(sock[0])
        return "127.0.0.1"

    def _runs_changed(self) -> None:
        self._write_state("connected" if self.connected.is_set() else "disconnected")

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def heartbeat_s(self) -> float:
        """Heartbeat period: the server's (from welcome), else this process's own setting."""
        return self.server_heartbeat_s or protocol.heartbeat_interval_s()

    def resume_grace_s(self) -> float:
        """How long runs keep going while disconnected: the server's grace, else this process's own."""
        return self.server_grace_s or protocol.resume_grace_s()

    def _write_state(self, state: str, reason: str = "", **extra: Any) -> None:
        self.state = {
            "name": self.cfg.name,
            "pid": os.getpid(),
            "state": state,
            "reason": reason,
            "server": extra.pop("server", self.state.get("server")),
            "devices": None if self.last_devices is None else [d["name"] for d in self.last_devices],
            "simulated": self.inventory.simulated,
            "runs": self.runs.active_ids(),
            "started_at": self.state.get("started_at", time.time()),
            "updated_at": time.time(),
            **extra,
        }
        try:
            write_private_json(state_file(self.cfg.home, self.cfg.name), self.state)
        except OSError as exc:
            log.warning("cannot write the agent state file: %s", exc)

    # --- messages -----------------------------------------------------------------------------
    def node_types(self) -> list[str]:
        """Node classes this agent's runner can execute (compared with the sidecar's)."""
        if self._node_types is None:
            from ...nodes import NODE_CLASS_MAPPINGS  # shipped with the agent: a broken import is a bug

            self._node_types = sorted(NODE_CLASS_MAPPINGS)
        return self._node_types

    async def _send(self, text: str) -> bool:
        ws = self.ws
        if ws is None or ws.closed:
            return False
        try:
            async with self._send_lock:
                await ws.send_str(text)
            return True
        except (ConnectionError, RuntimeError, OSError) as exc:
            log.info("send failed (%s); events stay buffered until the next connection", exc)
            return False

    # --- connection -----------------------------------------------------------------------------
    async def connection_loop(self) -> None:
        """Connect, serve, and reconnect with backoff until the agent stops."""
        import aiohttp

        retry = Backoff(0.5, AGENT_RECONNECT_MAX_S)
        timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10)
        while not self.stopping.is_set():
            try:
                auth = resolve_auth(self.cfg)
            except AuthError as exc:
                self._write_state("waiting", str(exc))
                log.warning("%s", exc)
                await self._sleep(retry.next())
                continue
            welcomed = False
            # One client session per attempt: an SSH worker's server is a Unix socket (its tunnel's end)
            sock = unix_socket_of(auth.url)
            connector = aiohttp.UnixConnector(path=sock) if sock is not None else None
            async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
                try:
                    welcomed = await self._session(session, auth)
                except aiohttp.ServerFingerprintMismatch as exc:
                    reason = tls.fingerprint_mismatch_text(auth.fingerprint or "", exc.got)
                    self._write_state("rejected", reason, server=auth.url)
                    log.error("refusing the server at %s: %s", auth.url, reason)
                    await self.refusals.report(auth, exc.got)
                except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
                    self._write_state("disconnected", f"cannot reach {auth.url}: {exc}", server=auth.url)
                    log.info("connection to %s failed: %s", auth.url, exc)
                except protocol.ProtocolError as exc:
                    self._write_state("disconnected", f"protocol error: {exc}", server=auth.url)
                    log.warning("protocol error from the server: %s", exc)
                except Exception as exc:  # a bug must not end the agent's reconnect loop
                    log.exception("connection to %s failed", auth.url)
                    self._write_state("disconnected", f"internal error: {exc}", server=auth.url)
                finally:
                    if self.ws is not None:
                        with contextlib.suppress(Exception):
                            await self.ws.close()
                    self.ws = None
                    if self.connected.is_set():
                        self.connected.clear()
                        self.disconnected_since = time.monotonic()
                        if not self.stopping.is_set():
                            self._write_state("disconnected", "connection lost; reconnecting", server=auth.url)
            if welcomed:
                retry.reset()
            await self._sleep(retry.next())

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.stopping.wait(), timeout=seconds)

    async def _session(self, session: Any, auth: AuthChoice) -> bool:
        """One connection: hello, welcome, then serve until it closes. True when welcomed."""
        import aiohttp

        headers = {"X-Xpufleet-Agent": self.cfg.name}  # the credential itself goes in the hello only
        if self.state.get("state") != "rejected":  # a refused pin stays the news until a connection succeeds
            self._write_state("connecting", f"connecting to {auth.url}", server=auth.url)
        async with session.ws_connect(
            ws_url(auth.url), headers=headers, max_msg_size=protocol.MAX_MESSAGE_BYTES,
            heartbeat=max(5.0, self.heartbeat_s() * 2), autoping=True, ssl=tls.aiohttp_ssl(auth.fingerprint),
        ) as ws:
            self.last_devices = await asyncio.to_thread(self.inventory.snapshot)
            hello = protocol.encode(
                "hello", name=self.cfg.name, version=VERSION, protocol=AGENT_PROTOCOL,
                auth={"kind": auth.kind, "token": auth.token}, node_types=self.node_types(),
                devices=self.last_devices, env=devinv.environment_summary(self.inventory),
                runs=self.runs.summary(), pid=os.getpid(), instance=self.instance,
                mounts={label: str(path) for label, path in self.cfg.mounts.items()}, one_shot=self.cfg.one_shot,
                # runs are capped to their budget (server/run/memory.py); a ComfyUI's reading follows
                capabilities=[AGENT_CAP_MEMORY, *self.comfy.capabilities()],
            )
            await ws.send_str(hello)
            first = await asyncio.wait_for(ws.receive(), timeout=AGENT_HELLO_TIMEOUT_S)
            if first.type != aiohttp.WSMsgType.TEXT:
                raise ConnectionError(f"the server closed the connection before welcome ({first.type.name})")
            msg = protocol.decode(first.data, protocol.SIDECAR_TO_AGENT)
            if msg["type"] == "reject":
                self._write_state("rejected", msg["reason"], server=auth.url)
                log.error("the server refused this agent: %s", msg["reason"])
                return False
            if msg["type"] != "welcome":
                raise protocol.ProtocolError(f"expected welcome, got {msg['type']}")
            if msg.get("credential"):
                write_private_json(credential_file(self.cfg.home, self.cfg.name),
                                   {"server": auth.url, "name": self.cfg.name, "credential": msg["credential"],
                                    "fingerprint": auth.fingerprint})
                self.cfg.join_token = None  # one-time: spent
            self._pin = auth.fingerprint
            self.server_heartbeat_s = msg.get("heartbeat_interval_s") or self.server_heartbeat_s
            self.server_grace_s = msg.get("resume_grace_s") or self.server_grace_s
            self.ws = ws
            self.connected.set()
            self._write_state("connected", "", server=auth.url)
            log.info("connected to %s as %s", auth.url, self.cfg.name)
            await self._reconcile(msg["runs"])
            await self.instances.after_welcome()
            await self.comfy.after_welcome()
            hb = asyncio.create_task(self._heartbeat_loop(ws))
            try:
                async for m in protocol.messages(ws, protocol.SIDECAR_TO_AGENT, _bad_message):
                    await self._handle(m)
            finally:
                await cancel_and_wait([hb])
            return True

    async def _heartbeat_loop(self, ws: Any) -> None:
        interval = self.heartbeat_s()
        while not ws.closed:
            await asyncio.sleep(interval)
            try:
                self.last_devices = await asyncio.to_thread(self.inventory.snapshot)
            except Exception as exc:
                log.warning("device probe failed: %s", exc)
            try:
                memory = await asyncio.to_thread(run_memory, self.inventory, self.runs.table.values())
            except Exception as exc:  # per-run figures are extra: never stop the heartbeat
                log.warning("per-run memory probe failed: %s", exc)
                memory = {}
            ok = await self._send(protocol.encode(
                "heartbeat", devices=self.last_devices, runs=self.runs.summary(memory), ts=time.time()))
            if not ok:
                return

    async def _reconcile(self, known: dict[str, int]) -> None:
        """After welcome: replay what the sidecar lacks; stop runs it no longer expects."""
        ws = self.ws

        async def send_raw(text: str) -> bool:
            await ws.send_str(text)
            return True
        # Under the send lock: replays go out before any live event recorded meanwhile (in seq order).
        async with self._send_lock:
            await self.runs.reconcile(known, send_raw)

    async def _handle(self, msg: dict[str, Any]) -> None:
        mtype = msg["type"]
        if mtype == "start_run":
            await self.runs.start(msg)
        elif mtype == "cancel_run":
            rs = self.runs.table.get(msg["run_id"])
            if rs is not None:
                self.runs.stop(rs, "cancel")
        elif mtype == "ack":
            rs = self.runs.table.get(msg["run_id"])
            if rs is not None:
                self.runs.ack(rs, msg["seq"])
        elif mtype == "forget_run":
            rs = self.runs.table.get(msg["run_id"])
            if rs is not None:
                await self.runs.forget(rs, msg.get("reason") or "forgotten by the server")
        elif mtype == "read_outputs":
            self._spawn(self.outputs.serve(msg))
        elif mtype in ("start_instance", "stop_instance"):
            await self.instances.handle(msg)
        elif mtype in ("start_part", "stop_part"):  # ranks of a run spread over workers (parts.py)
            await self.parts.handle(msg)
        elif mtype == "credential":  # reissued: the old credential no longer works
            server = self.state.get("server")
            write_private_json(credential_file(self.cfg.home, self.cfg.name),
                               {"server": server, "name": self.cfg.name, "credential": msg["credential"],
                                "fingerprint": self._pin})
            log.info("the server reissued this worker's credential; the new one is stored")
        elif mtype == "reject":
            self._write_state("removed" if msg.get("removed") else "rejected", msg["reason"])
            log.error("the server dropped this agent: %s", msg["reason"])
            if msg.get("removed"):
                self.removed = True
                self.stopping.set()

    async def grace_loop(self) -> None:
        """While disconnected longer than the resume grace, stop the runs: they end interrupted."""
        while not self.stopping.is_set():
            await self._sleep(min(1.0, self.resume_grace_s() / 4))
            if self.connected.is_set():
                continue
            if time.monotonic() - self.disconnected_since >= self.resume_grace_s():
                self.runs.stop_all("grace")
                self.instances.stop_all()

    async def main(self) -> int:
        """Run until SIGTERM/SIGINT; then stop the runs (interrupted) and report them if connected."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stopping.set)
        self._write_state("starting")
        warm = asyncio.create_task(warm_up())  # the warm start parent, in the background
        self.comfy.start()  # its ComfyUI read in the background
        conn = asyncio.create_task(self.connection_loop())
        grace = asyncio.create_task(self.grace_loop())
        await self.stopping.wait()
        active = self.runs.stop_all("shutdown")
        self.instances.stop_all()
        self.parts.stop_all()
        tasks = [rs.task for rs in active if rs.task is not None] + self.instances.tasks() + self.parts.tasks()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=RUN_STOP_GRACE_S + 5)
            for rs in active:
                if rs.process is not None:
                    rs.process.kill()
        await self.comfy.stop_all()  # after the runs: a stopping run still talks to its instance
        await self.runs.await_acks(self.connected, SHUTDOWN_ACK_WAIT_S)
        await cancel_and_wait((grace, conn, warm))
        self._write_state("removed" if self.removed else ("done" if self.runs.took_run and self.cfg.one_shot else "stopped"))
        return 0


def run_agent(cfg: AgentConfig) -> int:
    """Run an agent in the foreground until it is stopped; the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = Agent(cfg)
    return asyncio.run(agent.main())
