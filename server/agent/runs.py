"""The runs one agent holds (docs/workers.md): each started through the run host (server/run/host.py), its
events kept until the sidecar acks them (replayed after a reconnect), stopped on request, on the resume
grace or at shutdown, and forgotten once the sidecar holds everything.

A component of :class:`~.agent.Agent` with explicit dependencies: the config, the inventory, a ``send``
callable (one WebSocket frame; False while disconnected), the offered devices, the resume grace and two
callbacks (the state file changed; a one-shot agent's run is done).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...constants import RUN_KIND_COMFYUI, RUN_STOP_GRACE_S
from ..devices import names as devnames
from ..devices import renumbering as devren
from ..devices.inventory import Inventory
from ..run import ddp, spread
from ..run.comfy_instances import ComfyError
from ..run.host import RunProcess
from ..run.launcher import LaunchError, ProcessGroup, member_env
from ..run.spec import RunSpec, build_spec
from ..run.warm import default_starter
from ..workers import protocol
from .comfyui import AgentComfy, no_comfyui_text
from .config import AgentConfig, agents_dir

log = logging.getLogger("xpufleet.agent")

# How the agent's stop reasons reach the run: "interrupt" ends it interrupted, "cancel" cancelled.
STOP_COMMAND = {"cancel": "cancel", "forget": "cancel", "grace": "interrupt", "shutdown": "interrupt"}
MAX_BUFFERED_EVENTS = 200_000  # per run; beyond this the oldest progress events are dropped

Send = Callable[[str], Awaitable[bool]]


@dataclass
class RunState:
    """One run on this agent: its process, and its events not yet acked by the sidecar."""

    run_id: str
    run_dir: Path
    machine_devices: list[str]
    process: RunProcess | None = None
    pending: asyncio.Queue[dict[str, Any] | None] = field(default_factory=asyncio.Queue)
    events: list[dict[str, Any]] = field(default_factory=list)
    last_seq: int = 0
    acked_seq: int = 0
    finished_seq: int | None = None  # seq of run_finished once it exists
    stop_reason: str | None = None  # "cancel" | "grace" | "forget" | "shutdown"
    forgotten: bool = False
    task: asyncio.Task | None = None
    extra_pids: list[int] = field(default_factory=list)  # a ComfyUI run's instance (its memory is the run's)

    @property
    def group(self) -> ProcessGroup | None:
        """The run's launcher group (usage.py counts its members' memory)."""
        return self.process.group if self.process is not None else None

    @property
    def finished(self) -> bool:
        return self.finished_seq is not None

    def status(self) -> str:
        return "finished" if self.finished else "running"


def event_frame(rs: RunState, ev: dict[str, Any]) -> str:
    """One run event as the protocol's ``event`` message."""
    return protocol.encode("event", run_id=rs.run_id, seq=ev["seq"], event_type=ev["type"],
                           payload=ev.get("payload") or {}, ts=ev.get("ts", time.time()))


class AgentRuns:
    """The runs of one agent (see the module docstring)."""

    def __init__(self, cfg: AgentConfig, inventory: Inventory, send: Send, *,
                 offered: Callable[[], list[dict[str, Any]]], resume_grace_s: Callable[[], float],
                 on_change: Callable[[], None], on_all_done: Callable[[], None],
                 comfy: AgentComfy | None = None) -> None:
        self.cfg = cfg
        self.comfy = comfy  # ComfyUI runs lease its instances
        self.inventory = inventory
        self.send = send
        self.offered = offered
        self.resume_grace_s = resume_grace_s
        self.on_change = on_change
        self.on_all_done = on_all_done
        self.table: dict[str, RunState] = {}
        self.took_run: str | None = None  # a one-shot agent's one run
        self.acked = asyncio.Event()  # set by each ack from the server (shutdown waits on them)

    # --- what the sidecar sees -----------------------------------------------------------------
    def summary(self, memory: dict[str, dict[str, float]] | None = None) -> list[dict[str, Any]]:
        """The runs this agent holds; ``memory``: GiB per card each run's processes use (NVML)."""
        out = []
        for r in self.table.values():
            if r.forgotten:
                continue
            entry: dict[str, Any] = {"run_id": r.run_id, "last_seq": r.last_seq, "status": r.status()}
            if memory and memory.get(r.run_id):
                entry["memory"] = memory[r.run_id]
            out.append(entry)
        return out

    def active_ids(self) -> list[str]:
        """The runs not finished yet (the state file lists them)."""
        return sorted(r for r, s in self.table.items() if not s.finished)

    async def reconcile(self, known: dict[str, int], send_raw: Send) -> None:
        """After welcome: replay what the sidecar lacks (``send_raw``: under the caller's send lock, so
        replays go out before any live event); stop runs it no longer expects."""
        for run_id, rs in list(self.table.items()):
            if run_id not in known:
                await self.forget(rs, "the server no longer expects this run")
                continue
            self.ack(rs, known[run_id])
            for ev in list(rs.events):
                if ev["seq"] > known[run_id]:
                    await send_raw(event_frame(rs, ev))

    def ack(self, rs: RunState, seq: int) -> None:
        """The sidecar holds ``rs``'s events up to ``seq``."""
        rs.acked_seq = max(rs.acked_seq, seq)
        rs.events = [e for e in rs.events if e["seq"] > rs.acked_seq]
        self.acked.set()
        if rs.finished and rs.acked_seq >= (rs.finished_seq or 0):
            self._done_with(rs)

    async def forget(self, rs: RunState, reason: str) -> None:
        """The sidecar no longer wants ``rs``: drop its events, stop it if it runs."""
        rs.forgotten = True
        rs.events.clear()
        if rs.finished:
            self._done_with(rs)
        else:
            log.info("run %s: %s; stopping it", rs.run_id, reason)
            self.stop(rs, "forget")

    def _done_with(self, rs: RunState) -> None:
        """The server holds everything of a finished run: forget it; a one-shot agent then exits."""
        self.table.pop(rs.run_id, None)
        if self.cfg.one_shot and self.took_run is not None and not self.table:
            log.info("one-shot agent: run %s ended and is reported; exiting", self.took_run)
            self.on_all_done()

    async def await_acks(self, connected: asyncio.Event, bound_s: float) -> bool:
        """Wait, while connected and at most ``bound_s``, for the acks of every event; True: all acked."""
        deadline = time.monotonic() + bound_s
        while any(rs.events for rs in self.table.values() if not rs.forgotten):
            if not connected.is_set() or time.monotonic() >= deadline:
                return False
            self.acked.clear()
            with contextlib.suppress(asyncio.TimeoutError):  # at most 0.5 s: re-check the connection
                await asyncio.wait_for(self.acked.wait(), min(deadline - time.monotonic(), 0.5))
        return True

    # --- events ----------------------------------------------------------------------------------
    def run_dir(self, run_id: str) -> Path:
        """``agents/<name>/runs/<run id>``: where a run executes and its outputs stay."""
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
            await self.send(event_frame(rs, ev))
        if rs.forgotten and rs.finished:
            self._done_with(rs)

    # --- starting -------------------------------------------------------------------------------
    async def start(self, msg: dict[str, Any]) -> None:
        """Start one run in its own subprocess (duplicates of a known run id are ignored)."""
        run_id = msg["run_id"]
        if run_id in self.table:
            return
        rs = RunState(run_id, self.run_dir(run_id), list(msg["devices"]))
        self.table[run_id] = rs
        if self.cfg.one_shot and self.took_run is not None:
            await self._finish_without_child(rs, "failed", f"the one-shot agent on worker {self.cfg.name} already "
                                                           f"took its one run ({self.took_run})")
            return
        self.took_run = run_id
        offered = {d["name"] for d in self.offered()}
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
                if rs.process is not None:
                    rs.process.kill()
                await self._finish_without_child(rs, "failed", f"the agent on worker {self.cfg.name} "
                                                 f"failed to run it: {type(exc).__name__}: {exc}")

    async def _finish_without_child(self, rs: RunState, status: str, error: str) -> None:
        ev = {"seq": rs.last_seq + 1, "type": "run_finished", "ts": time.time(),
              "payload": {"status": status, "error": error, "final_metrics": {}, "peak_memory": {},
                          "execution_facts": {"worker": self.cfg.name}}}
        await self._record(rs, ev)
        self.on_change()

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
        if spec.kind == RUN_KIND_COMFYUI:
            try:
                spec.comfyui = await self._lease_comfyui(rs, spec, renum)
                rs.extra_pids = [spec.comfyui["pid"]] if spec.comfyui.get("pid") else []
            except ComfyError as exc:
                await self._finish_without_child(rs, "failed", str(exc))
                return
            try:
                await self._run_process(rs, spec, machine, renum, layout)
            finally:
                assert self.comfy is not None
                self.comfy.release(rs.machine_devices)
            return
        await self._run_process(rs, spec, machine, renum, layout)

    async def _lease_comfyui(self, rs: RunState, spec: RunSpec, renum: devren.Renumbering) -> dict[str, Any]:
        """A ComfyUI run's instance: its cards' warm ComfyUI (``--cpu`` on simulated cards and the CPU)."""
        if self.comfy is None or not self.comfy.enabled:
            raise ComfyError(no_comfyui_text(self.cfg.name))
        cpu = spec.simulated or all(devnames.device_kind(d) == "cpu" for d in rs.machine_devices)
        return await self.comfy.lease(rs.machine_devices, cpu=cpu, env={**self.cfg.extra_env, **renum.env})

    async def _run_process(self, rs: RunState, spec: RunSpec, machine: list[str], renum: devren.Renumbering,
                           layout: Any) -> None:
        spec.write(rs.run_dir)
        extra = {**self.cfg.extra_env, **renum.env}
        # A run with a ddp loop: every rank on loopback with one thread, unless this agent's env says otherwise.
        extra.update({**ddp.rank_env(spec.graph, spec.world_size, {**os.environ, **extra}),
                      **spread.leader_env(layout, {**os.environ, **extra})})  # its sockets: the advertised address
        env = member_env(None, extra)

        def on_events(rank: int, events: list[dict[str, Any]]) -> None:
            followers.see(rank, events)  # ddp_ready from rank 0: ranks 1..N-1 join the group
            if rank == 0:
                for ev in events:
                    rs.pending.put_nowait(ev)

        process = rs.process = RunProcess(rs.run_id, rs.run_dir, env, on_events, starter=default_starter(),
                                          stop_grace_s=RUN_STOP_GRACE_S)
        followers = spread.followers(process.group, rs.run_dir, spec.world_size, env, layout)
        pump = asyncio.create_task(self._pump(rs))
        try:
            await process.start()
        except LaunchError as exc:
            rs.pending.put_nowait(None)
            await pump
            await self._finish_without_child(rs, "failed", str(exc))
            return
        if rs.stop_reason is not None:  # stopped while it was starting
            process.stop(STOP_COMMAND[rs.stop_reason])
        self.on_change()
        log.info("run %s started (pid %s) on %s", rs.run_id, process.pid, ", ".join(machine))
        result = await process.wait()
        rs.pending.put_nowait(None)
        await pump
        # Rank 0's report, for the whole group: a ddp follower's failure is the run's error (server/run/ddp.py).
        payload = spread.leader_finish(result, layout)
        if payload is not None:
            ev = result.finished_event or {"seq": rs.last_seq + 1, "type": "run_finished", "ts": time.time()}
            await self._record(rs, self._finish_payload(rs, {**ev, "payload": payload}, renum))
        else:
            ending = process.ending(result, interrupted=self._interrupt_reason(rs.stop_reason or "shutdown"),
                                    worker=self.cfg.name)
            await self._finish_without_child(rs, ending.status, ending.error)
        log.info("run %s ended (exit code %s)", rs.run_id, result.exits[0].returncode)

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

    # --- stopping ---------------------------------------------------------------------------------
    def stop(self, rs: RunState, reason: str) -> None:
        """Ask the run's processes to stop (a line on their stdin), killed after the grace period."""
        if rs.finished or rs.stop_reason is not None and reason != "shutdown":
            return
        rs.stop_reason = reason
        if rs.process is not None:
            # "interrupt": the run ends interrupted (grace, agent stopping); "cancel": cancelled
            rs.process.stop(STOP_COMMAND[reason])

    def stop_all(self, reason: str) -> list[RunState]:
        """Stop every run still going that has no stop yet (``shutdown`` stops them all); those runs."""
        active = [rs for rs in self.table.values() if not rs.finished
                  and (rs.stop_reason is None or reason == "shutdown")]
        for rs in active:
            if reason == "grace":
                log.warning("run %s: disconnected longer than the grace; stopping it", rs.run_id)
            self.stop(rs, reason)
        return active
