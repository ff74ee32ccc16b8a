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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common import tls
from ...common.backoff import Backoff
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
from ..devices import names as devnames
from ..devices import renumbering as devren
from ..run import ddp, spread
from ..run.events import describe_exit
from ..run.launcher import LaunchError, ProcessGroup, member_env, single
from ..run.spec import RunSpec, build_spec
from ..run.warm import default_starter, warm_up
from ..workers import protocol
from .config import (  # noqa: F401 - default_name, one_shot_name: the CLI's agent.default_name()
    AgentConfig,
    AuthChoice,
    AuthError,
    agents_dir,
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
from .remote import RemoteFeatures
from .usage import run_memory

log = logging.getLogger("xpufleet.agent")

_STOP_COMMAND = {"cancel": "cancel", "forget": "cancel", "grace": "interrupt", "shutdown": "interrupt"}
MAX_BUFFERED_EVENTS = 200_000  # per run; beyond this the oldest progress events are dropped


# --- runs ---------------------------------------------------------------------------------------


@dataclass
class RunState:
    """One run on this agent: its process, and its events not yet acked by the sidecar."""

    run_id: str
    run_dir: Path
    machine_devices: list[str]
    group: ProcessGroup | None = None
    pending: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    events: list[dict[str, Any]] = field(default_factory=list)
    last_seq: int = 0
    acked_seq: int = 0
    finished_seq: int | None = None  # seq of run_finished once it exists
    stop_reason: str | None = None  # "cancel" | "grace" | "forget" | "shutdown"
    forgotten: bool = False
    task: asyncio.Task | None = None

    @property
    def finished(self) -> bool:
        return self.finished_seq is not None

    def status(self) -> str:
        return "finished" if self.finished else "running"


class Agent(RemoteFeatures):
    """The agent process's state and loops (one asyncio event loop)."""

    def __init__(self, cfg: AgentConfig) -> None:
        self.cfg = cfg
        self.inventory = devinv.Inventory(cfg.name, cfg.home, cfg.devices, cfg.simulate)
        self.runs: dict[str, RunState] = {}
        self.ws: Any = None
        self.stopping = asyncio.Event()
        self.connected = asyncio.Event()
        self.acked = asyncio.Event()  # set by each ack from the server (shutdown waits on them)
        self.disconnected_since: float = time.monotonic()
        self.state: dict[str, Any] = {"state": "starting"}
        self._send_lock = asyncio.Lock()
        self._node_types: list[str] | None = None
        self.removed = False
        self.instance = uuid.uuid4().hex  # this process, told apart from another agent of the same name
        # The server's settings, from its last welcome: a remote agent does not share its environment.
        self.server_heartbeat_s: float | None = None
        self.server_grace_s: float | None = None
        self.took_run: str | None = None  # a one-shot agent's one run
        self._pin: str | None = None  # the certificate pinned on the current connection
        self._refusals_reported: set[str] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.last_devices: list[dict[str, Any]] | None = None  # the last inventory snapshot sent
        self.instances = InstanceHost(self)  # inference unit instances (instances.py)
        self.parts = PartHost(self)

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
            "runs": sorted(r for r, s in self.runs.items() if not s.finished),
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

    def _runs_summary(self, memory: dict[str, dict[str, float]] | None = None) -> list[dict[str, Any]]:
        """The runs this agent holds; ``memory``: GiB per card each run's processes use (NVML)."""
        out = []
        for r in self.runs.values():
            if r.forgotten:
                continue
            entry: dict[str, Any] = {"run_id": r.run_id, "last_seq": r.last_seq, "status": r.status()}
            if memory and memory.get(r.run_id):
                entry["memory"] = memory[r.run_id]
            out.append(entry)
        return out

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

    @staticmethod
    def _event_frame(rs: RunState, ev: dict[str, Any]) -> str:
        return protocol.encode("event", run_id=rs.run_id, seq=ev["seq"], event_type=ev["type"],
                               payload=ev.get("payload") or {}, ts=ev.get("ts", time.time()))

    async def _send_event(self, rs: RunState, ev: dict[str, Any]) -> None:
        if not rs.forgotten:
            await self._send(self._event_frame(rs, ev))

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
                    await self._report_refusal(auth, exc.got)
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
                runs=self._runs_summary(), pid=os.getpid(), instance=self.instance,
                mounts={label: str(path) for label, path in self.cfg.mounts.items()}, one_shot=self.cfg.one_shot,
                capabilities=[AGENT_CAP_MEMORY],  # runs are capped to their budget (server/run/memory.py)
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
            hb = asyncio.create_task(self._heartbeat_loop(ws))
            try:
                async for frame in ws:
                    if frame.type != aiohttp.WSMsgType.TEXT:
                        break
                    try:
                        m = protocol.decode(frame.data, protocol.SIDECAR_TO_AGENT)
                    except protocol.ProtocolError as exc:
                        log.warning("ignoring a bad message from the server: %s", exc)
                        continue
                    await self._handle(m)
            finally:
                hb.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await hb
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
                memory = await asyncio.to_thread(run_memory, self.inventory, self.runs.values())
            except Exception as exc:  # per-run figures are extra: never stop the heartbeat
                log.warning("per-run memory probe failed: %s", exc)
                memory = {}
            ok = await self._send(protocol.encode(
                "heartbeat", devices=self.last_devices, runs=self._runs_summary(memory), ts=time.time()))
            if not ok:
                return

    async def _reconcile(self, known: dict[str, int]) -> None:
        """After welcome: replay what the sidecar lacks; stop runs it no longer expects."""
        # Under the send lock: replays go out before any live event recorded meanwhile (in seq order).
        async with self._send_lock:
            for run_id, rs in list(self.runs.items()):
                if run_id not in known:
                    await self._forget(rs, "the server no longer expects this run")
                    continue
                self._ack(rs, known[run_id])
                for ev in list(rs.events):
                    if ev["seq"] > known[run_id] and self.ws is not None:
                        await self.ws.send_str(self._event_frame(rs, ev))

    async def _handle(self, msg: dict[str, Any]) -> None:
        mtype = msg["type"]
        if mtype == "start_run":
            await self.start_run(msg)
        elif mtype == "cancel_run":
            rs = self.runs.get(msg["run_id"])
            if rs is not None:
                self.stop_run(rs, "cancel")
        elif mtype == "ack":
            rs = self.runs.get(msg["run_id"])
            if rs is not None:
                self._ack(rs, msg["seq"])
        elif mtype == "forget_run":
            rs = self.runs.get(msg["run_id"])
            if rs is not None:
                await self._forget(rs, msg.get("reason") or "forgotten by the server")
        elif mtype == "read_outputs":
            self._spawn(self._serve_outputs(msg))
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

    def _ack(self, rs: RunState, seq: int) -> None:
        rs.acked_seq = max(rs.acked_seq, seq)
        rs.events = [e for e in rs.events if e["seq"] > rs.acked_seq]
        self.acked.set()
        if rs.finished and rs.acked_seq >= (rs.finished_seq or 0):
            self._done_with(rs)

    async def _forget(self, rs: RunState, reason: str) -> None:
        rs.forgotten = True
        rs.events.clear()
        if rs.finished:
            self._done_with(rs)
        else:
            log.info("run %s: %s; stopping it", rs.run_id, reason)
            self.stop_run(rs, "forget")

    # --- runs ----------------------------------------------------------------------------------
    def _run_dir(self, run_id: str) -> Path:
        safe = "".join(c for c in run_id if c.isalnum() or c in "-_") or "run"
        return agents_dir(self.cfg.home) / self.cfg.name / "runs" / safe

    async def _record(self, rs: RunState, ev: dict[str, Any]) -> None:
        """Keep one event (for replay) and send it when connected."""
        if ev.get("type") == "run_finished":
            rs.finished_seq = ev["seq"]
        rs.last_seq = max(rs.last_seq, ev["seq"])
        if not rs.forgotten:
            rs.events.append(ev)
            if len(rs.events) > MAX_BUFFERED_EVENTS:  # a very long disconnect: drop old progress
                for i, old in enumerate(rs.events):
                    if old["type"] == "progress":
                        del rs.events[i]
                        break
            await self._send_event(rs, ev)
        if rs.forgotten and rs.finished:
            self._done_with(rs)

    async def start_run(self, msg: dict[str, Any]) -> None:
        """Start one run in its own subprocess (duplicates of a known run id are ignored)."""
        run_id = msg["run_id"]
        if run_id in self.runs:
            return
        rs = RunState(run_id, self._run_dir(run_id), list(msg["devices"]))
        self.runs[run_id] = rs
        if self.cfg.one_shot and self.took_run is not None:
            await self._finish_without_child(rs, "failed", f"the one-shot agent on worker {self.cfg.name} already "
                                                           f"took its one run ({self.took_run})")
            return
        self.took_run = run_id
        offered = {d["name"] for d in (self.last_devices or self.inventory.snapshot())}
        try:
            machine = [devnames.normalize_device(d) for d in msg["devices"]]
            missing = [d for d in machine if d not in offered]
            if missing:
                raise devnames.DeviceSpecError(
                    f"worker {self.cfg.name} does not offer {', '.join(missing)} (it offers {', '.join(sorted(offered))})"
                )
            renum = devren.renumber(machine)
        except devnames.DeviceSpecError as exc:
            await self._finish_without_child(rs, "failed", str(exc))
            return
        rs.task = asyncio.create_task(self._guarded_child(rs, msg, machine, renum))

    async def _guarded_child(self, rs: RunState, msg: dict[str, Any], machine: list[str],
                             renum: devren.Renumbering) -> None:
        try:
            await self._run_child(rs, msg, machine, renum)
        except Exception as exc:  # the run must still end with a result the server sees
            log.exception("run %s: the agent failed to run it", rs.run_id)
            if not rs.finished:
                if rs.group is not None:
                    rs.group.kill()
                await self._finish_without_child(rs, "failed", f"the agent on worker {self.cfg.name} "
                                                 f"failed to run it: {type(exc).__name__}: {exc}")

    async def _finish_without_child(self, rs: RunState, status: str, error: str) -> None:
        ev = {"seq": rs.last_seq + 1, "type": "run_finished", "ts": time.time(),
              "payload": {"status": status, "error": error, "final_metrics": {}, "peak_memory": {},
                          "execution_facts": {"worker": self.cfg.name}}}
        await self._record(rs, ev)
        self._write_state("connected" if self.connected.is_set() else "disconnected")

    def _spec(self, rs: RunState, msg: dict[str, Any], renum: devren.Renumbering) -> RunSpec:
        simulated = self.inventory.simulated and any(devnames.device_kind(d) == "cuda" for d in rs.machine_devices)
        run = {"id": rs.run_id, "graph": msg["graph"], "options": msg.get("options") or {},
               "budget_gib": msg.get("budget_gib")}
        return build_spec(run, placement="worker", slot_devices=rs.machine_devices, run_devices=renum.run_devices,
                          aliases=renum.aliases, visible_devices=renum.run_devices, env=renum.env,
                          worker=self.cfg.name, simulated=simulated)

    async def _run_child(self, rs: RunState, msg: dict[str, Any], machine: list[str],
                         renum: devren.Renumbering) -> None:
        layout = spread.leader_layout(msg, self.cfg.advertise_addr)  # None: not a run spread over workers
        spec = spread.with_layout(self._spec(rs, msg, renum), layout)
        spec.write(rs.run_dir)
        extra = {**self.cfg.extra_env, **renum.env}
        # A run with a ddp loop: every rank on loopback with one thread, unless this agent's env says otherwise.
        extra.update({**ddp.rank_env(spec.graph, spec.world_size, {**os.environ, **extra}),
                      **spread.leader_env(layout, {**os.environ, **extra})})  # its sockets: the advertised address
        env = member_env(None, extra)

        def on_events(rank: int, events: list[dict[str, Any]]) -> None:
            followers.see(rank, events)  # ddp_ready from rank 0: ranks 1..N-1 join the group
            self._relay(rs, rank, events)

        rs.group = ProcessGroup(single(rs.run_id, rs.run_dir, env, stop_grace_s=RUN_STOP_GRACE_S),
                                on_events=on_events, starter=default_starter())
        followers = spread.followers(rs.group, rs.run_dir, spec.world_size, env, layout)
        pump = asyncio.create_task(self._pump(rs))
        try:
            await rs.group.start()
        except LaunchError as exc:
            rs.pending.put_nowait(None)
            await pump
            await self._finish_without_child(rs, "failed", str(exc))
            return
        if rs.stop_reason is not None:  # stopped while it was starting
            rs.group.stop(_STOP_COMMAND[rs.stop_reason])
        self._write_state("connected" if self.connected.is_set() else "disconnected")
        log.info("run %s started (pid %s) on %s", rs.run_id, rs.group.pids[0], ", ".join(machine))
        result = await rs.group.wait()
        rs.pending.put_nowait(None)
        await pump
        # Rank 0's report, for the whole group: a ddp follower's failure is the run's error (server/run/ddp.py).
        payload = spread.leader_finish(result, layout)
        if payload is not None:
            ev = result.finished_event or {"seq": rs.last_seq + 1, "type": "run_finished", "ts": time.time()}
            await self._record(rs, self._finish_payload(rs, {**ev, "payload": payload}, renum))
        else:
            rc = result.exits[0].returncode
            await self._finish_without_child(rs, *self._death_status(rs, 255 if rc is None else rc))
        log.info("run %s ended (exit code %s)", rs.run_id, result.exits[0].returncode)

    def _relay(self, rs: RunState, rank: int, events: list[dict[str, Any]]) -> None:
        """Events from the run's process (the launcher's callback, on the loop): recorded in order."""
        if rank == 0:
            for ev in events:
                rs.pending.put_nowait(ev)

    async def _pump(self, rs: RunState) -> None:
        while (ev := await rs.pending.get()) is not None:
            await self._record(rs, ev)

    def _finish_payload(self, rs: RunState, ev: dict[str, Any], renum: devren.Renumbering) -> dict[str, Any]:
        """Complete the child's run_finished: worker facts, and ``interrupted`` when the agent stopped it."""
        payload = dict(ev.get("payload") or {})
        facts = dict(payload.get("execution_facts") or {})
        facts.setdefault("worker", self.cfg.name)
        facts.setdefault("visible_devices", renum.run_devices)
        facts.setdefault("device_aliases", renum.aliases)
        payload["execution_facts"] = facts
        if rs.stop_reason in ("grace", "shutdown") and payload.get("status") in ("cancelled", "interrupted"):
            payload["status"] = "interrupted"
            payload["error"] = self._interrupt_reason(rs.stop_reason)
        return {**ev, "payload": payload}

    def _interrupt_reason(self, why: str) -> str:
        if why == "grace":
            return (f"worker {self.cfg.name} lost its connection to the server for more than "
                    f"{self.resume_grace_s():g} s (XPUFLEET_WORKER_RESUME_GRACE_S)")
        return f"the agent on worker {self.cfg.name} was stopped"

    def _death_status(self, rs: RunState, rc: int) -> tuple[str, str]:
        if rs.stop_reason in ("grace", "shutdown"):
            return "interrupted", self._interrupt_reason(rs.stop_reason)
        if rs.stop_reason in ("cancel", "forget"):
            return "cancelled", "cancelled"
        verb = "was " if rc < 0 else ""
        return "failed", f"the run's process on worker {self.cfg.name} {verb}{describe_exit(rc)} (see output.log)"

    def stop_run(self, rs: RunState, reason: str) -> None:
        """Ask the run's processes to stop (a line on their stdin), killed after the grace period."""
        if rs.finished or rs.stop_reason is not None and reason != "shutdown":
            return
        rs.stop_reason = reason
        if rs.group is not None:
            # "interrupt": the run ends interrupted (grace, agent stopping); "cancel": cancelled
            rs.group.stop(_STOP_COMMAND[reason])

    async def grace_loop(self) -> None:
        """While disconnected longer than the resume grace, stop the runs: they end interrupted."""
        while not self.stopping.is_set():
            await self._sleep(min(1.0, self.resume_grace_s() / 4))
            if self.connected.is_set():
                continue
            if time.monotonic() - self.disconnected_since >= self.resume_grace_s():
                for rs in list(self.runs.values()):
                    if not rs.finished and rs.stop_reason is None:
                        log.warning("run %s: disconnected longer than the grace; stopping it", rs.run_id)
                        self.stop_run(rs, "grace")
                self.instances.stop_all()

    async def main(self) -> int:
        """Run until SIGTERM/SIGINT; then stop the runs (interrupted) and report them if connected."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.add_signal_handler(sig, self.stopping.set)
        self._write_state("starting")
        warm = asyncio.create_task(warm_up())  # the warm start parent, in the background
        conn = asyncio.create_task(self.connection_loop())
        grace = asyncio.create_task(self.grace_loop())
        await self.stopping.wait()
        active = [rs for rs in self.runs.values() if not rs.finished]
        for rs in active:
            self.stop_run(rs, "shutdown")
        self.instances.stop_all()
        self.parts.stop_all()
        tasks = [rs.task for rs in active if rs.task is not None] + self.instances.tasks() + self.parts.tasks()
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=RUN_STOP_GRACE_S + 5)
            for rs in active:
                if rs.group is not None:
                    rs.group.kill()
        await self._await_acks(SHUTDOWN_ACK_WAIT_S)
        grace.cancel()
        conn.cancel()
        warm.cancel()
        for t in (grace, conn, warm):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        self._write_state("removed" if self.removed else ("done" if self.took_run and self.cfg.one_shot else "stopped"))
        return 0


    async def _await_acks(self, bound_s: float) -> bool:
        """Wait, while connected and at most ``bound_s``, for the acks of every event; True: all acked."""
        deadline = time.monotonic() + bound_s
        while any(rs.events for rs in self.runs.values() if not rs.forgotten):
            if not self.connected.is_set() or time.monotonic() >= deadline:
                return False
            self.acked.clear()
            with contextlib.suppress(asyncio.TimeoutError):  # at most 0.5 s: re-check the connection
                await asyncio.wait_for(self.acked.wait(), min(deadline - time.monotonic(), 0.5))
        return True


def run_agent(cfg: AgentConfig) -> int:
    """Run an agent in the foreground until it is stopped; the exit code."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    agent = Agent(cfg)
    return asyncio.run(agent.main())
