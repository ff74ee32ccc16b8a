"""Inference unit instances on an agent (docs/services.md): ``start_instance`` / ``stop_instance`` from the
sidecar, each instance a launcher group member (server/run/launcher.py) with the unit's environment.

An instance is one process on one card (renumbered to ``cuda:0`` like a worker run), running either the
built-in model server (forked warm, server/units/starter.py) or the service's command (cold, with
``{port}``-style placeholders filled in). The agent reports ``instance_state``: ``starting`` with the
ports it picked (rank 0 picks ``MASTER_PORT``, before it spawns, so the sidecar can start the other
ranks at once), ``running`` with the pid, ``arrived`` at the barrier (the model server says so on its
event pipe; a command arrives when it runs), ``exited`` with how it ended. After every (re)connection
it lists the instances it runs (``instances``) and the sidecar takes them over. Instances keep running
while the sidecar is away, for the resume grace, like runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from ..devices import names as devnames
from ..devices import renumbering as devren
from ..run.launcher import ColdStarter, GroupSpec, LaunchError, MemberSpec, ProcessGroup, member_env
from ..units.envcontract import HOST_ENV, PORT_ENV, PROGRAM_ENV, contract_of
from ..units.lifecycle import exit_cause
from ..units.spec import fill_placeholders
from ..units.starter import instance_starter
from ..workers import protocol
from .config import AgentConfig, agents_dir

log = logging.getLogger("xpufleet.agent")

MODEL_SERVER = "xpufleet.server.units.model_server"
REPLACE_WAIT_S = 10.0  # an older process of the same instance gets this long to go before a new one starts


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on now (bind to 0); the instance binds it moments later."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


IDENTITY = ("unit_id", "rank", "generation", "attempt")  # what names an instance in every instance message


class HostedInstance:
    """One instance this agent runs: who it is (from its ``start_instance``), how far it got, its process."""

    def __init__(self, start: Mapping[str, Any]) -> None:
        self.unit_id: str = start["unit_id"]
        self.rank: int = start["rank"]
        self.generation: int = start["generation"]
        self.attempt: int = start["attempt"]
        self.state = "starting"
        self.pid: int | None = None
        self.port: int | None = None
        self.master_port: int | None = None
        self.group: ProcessGroup | None = None
        self.task: asyncio.Task[None] | None = None
        self.error: str | None = None  # what the program said before it ended (its unit_error event)
        self.killed = False

    def identity(self) -> dict[str, Any]:
        """The fields that name this instance (``instance_state``, ``instances``, its ``instance.json``)."""
        return {key: getattr(self, key) for key in IDENTITY}

    def summary(self) -> dict[str, Any]:
        """This instance as an entry of the ``instances`` message."""
        return {**self.identity(), "state": self.state, "pid": self.pid, "port": self.port,
                "master_port": self.master_port}


class InstanceHost:
    """The instances one agent runs. Dependencies: the agent's config, a ``send`` callable (one frame to the
    sidecar), the devices the agent offers, and where instances listen (``listen_host``)."""

    def __init__(self, cfg: AgentConfig, send: Callable[[str], Awaitable[bool]],
                 offered: Callable[[], list[dict[str, Any]]], listen_host: Callable[[], str]) -> None:
        self.cfg = cfg
        self.send = send
        self.offered = offered
        self.listen_host = listen_host
        self.instances: dict[tuple[str, int], HostedInstance] = {}

    # --- messages ------------------------------------------------------------------------------------
    async def _report(self, inst: HostedInstance, state: str, **fields: Any) -> None:
        inst.state = state if state != "starting" else inst.state
        await self.send(protocol.encode("instance_state", **inst.identity(), state=state,
                                        **{k: v for k, v in fields.items() if v is not None}))

    async def after_welcome(self) -> None:
        """Tell a (new) sidecar which instances run here; it takes them over or stops them."""
        live = [i.summary() for i in self.instances.values() if i.state != "exited"]
        await self.send(protocol.encode("instances", instances=live))

    async def handle(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "start_instance":
            await self.start(msg)
        else:
            inst = self.instances.get((msg["unit_id"], msg["rank"]))
            if inst is not None:
                self.stop(inst, msg["mode"], float(msg.get("grace_s") or 0.0))

    # --- starting --------------------------------------------------------------------------------------
    def _dir(self, unit_id: str, rank: int) -> Path:
        safe = "".join(c for c in unit_id if c.isalnum() or c in "-_") or "unit"
        return agents_dir(self.cfg.home) / self.cfg.name / "instances" / f"{safe}-r{rank}"

    async def start(self, msg: dict[str, Any]) -> None:
        """Start one instance in the background (an older process of it is ended first)."""
        key = (msg["unit_id"], msg["rank"])
        old = self.instances.get(key)
        if old is not None:
            if (old.generation, old.attempt) >= (msg["generation"], msg["attempt"]):
                return  # a duplicate
            self.stop(old, "kill")
        inst = HostedInstance(msg)
        self.instances[key] = inst
        inst.task = asyncio.create_task(self._run(inst, msg, old.task if old is not None else None))

    async def _run(self, inst: HostedInstance, msg: dict[str, Any], previous: asyncio.Task[None] | None) -> None:
        if previous is not None:
            with contextlib.suppress(asyncio.TimeoutError, Exception):
                await asyncio.wait_for(asyncio.shield(previous), REPLACE_WAIT_S)
        try:
            await self._run_instance(inst, msg)
        except Exception as exc:  # the sidecar must still hear how it ended
            log.exception("instance %s/%d: the agent failed to run it", inst.unit_id, inst.rank)
            if inst.group is not None:
                inst.group.kill()
            await self._report(inst, "exited", cause=f"the agent on worker {self.cfg.name} failed to run it: "
                                                     f"{type(exc).__name__}: {exc}")
        finally:
            if self.instances.get((inst.unit_id, inst.rank)) is inst:
                del self.instances[(inst.unit_id, inst.rank)]

    async def _run_instance(self, inst: HostedInstance, msg: dict[str, Any]) -> None:
        offered = {d["name"] for d in self.offered()}
        try:
            device = devnames.normalize_device(msg["device"])
            if device not in offered:
                raise devnames.DeviceSpecError(f"worker {self.cfg.name} does not offer {device} "
                                               f"(it offers {', '.join(sorted(offered))})")
            renum = devren.renumber([device])
        except devnames.DeviceSpecError as exc:
            await self._report(inst, "exited", cause=str(exc))
            return
        host = self.listen_host()
        inst.port = free_port(host)
        env = dict(msg["env"])
        if msg["pick_ports"]:
            inst.master_port = free_port(host)
            env["MASTER_PORT"] = str(inst.master_port)
            if not env.get("MASTER_ADDR"):
                env["MASTER_ADDR"] = env["LWS_LEADER_ADDRESS"] = host
        await self._report(inst, "starting", port=inst.port, master_port=inst.master_port, address=host)
        run_dir = self._dir(inst.unit_id, inst.rank)
        run_dir.mkdir(parents=True, exist_ok=True)
        program = msg["program"]
        extra = {**self.cfg.extra_env, **renum.env, **env, PORT_ENV: str(inst.port), HOST_ENV: host}
        if "model" in program:
            extra[PROGRAM_ENV] = json.dumps({"model": program["model"]})
            argv = [sys.executable, "-m", MODEL_SERVER, str(run_dir)]
            starter: Any = instance_starter()
        else:
            extra.update({str(k): str(v) for k, v in (program.get("env") or {}).items()})
            argv = fill_placeholders(program["command"], {
                "port": str(inst.port), "host": host, "rank": str(inst.rank), "size": str(msg["size"]),
                "master_addr": env.get("MASTER_ADDR", ""), "master_port": env.get("MASTER_PORT", "")})
            starter = ColdStarter()
        member_environ = member_env(None, extra)
        (run_dir / "instance.json").write_text(json.dumps({
            **inst.identity(), "argv": argv, "env": contract_of(member_environ), "device": device, "started_at": time.time()}, indent=1))
        log_path = run_dir / "output.log"
        with open(log_path, "a") as fh:
            fh.write(f"--- generation {inst.generation} attempt {inst.attempt}: {' '.join(argv)}\n")
        spec = GroupSpec(f"{inst.unit_id}-r{inst.rank}-g{inst.generation}",
                         [MemberSpec(0, run_dir, member_environ, log_path, command=argv)])
        inst.group = ProcessGroup(spec, on_events=lambda _rank, events: self._events(inst, events), starter=starter)
        if inst.killed:  # stopped while it was being prepared
            await self._report(inst, "exited", cause="stopped before it started")
            return
        try:
            await inst.group.start()
        except LaunchError as exc:
            await self._report(inst, "exited", cause=str(exc))
            return
        inst.pid = inst.group.pids[0]
        if inst.killed:
            inst.group.kill()
        await self._report(inst, "running", pid=inst.pid, port=inst.port)
        if "command" in program:  # a command reaches the barrier when it runs
            await self._report(inst, "arrived", pid=inst.pid, env=contract_of(member_environ))
        log.info("instance %s rank %d (generation %d) started, pid %d", inst.unit_id, inst.rank, inst.generation,
                 inst.pid)
        result = await inst.group.wait()
        rc = result.exits[0].returncode
        inst.state = "exited"
        await self._report(inst, "exited", returncode=rc, cause=exit_cause(rc, inst.error))
        log.info("instance %s rank %d ended: %s", inst.unit_id, inst.rank, exit_cause(rc, inst.error))

    def _events(self, inst: HostedInstance, events: list[dict[str, Any]]) -> None:
        for ev in events:
            payload = ev.get("payload") if isinstance(ev.get("payload"), dict) else {}
            if ev.get("type") == "unit_arrived":
                env = {str(k): str(v) for k, v in (payload.get("env") or {}).items()}
                asyncio.get_running_loop().create_task(self._report(inst, "arrived", pid=inst.pid, env=env))
            elif ev.get("type") == "unit_error":
                inst.error = str(payload.get("error") or "")[:2000]

    # --- stopping -------------------------------------------------------------------------------------
    def stop(self, inst: HostedInstance, mode: str, grace_s: float = 0.0) -> None:
        """``kill`` now, or ``graceful``: SIGTERM (the model server finishes what it was asked), then kill."""
        inst.killed = inst.killed or mode == "kill"
        if inst.group is None:
            return
        if mode == "kill":
            inst.group.kill()
        else:
            inst.group.terminate(max(grace_s, 0.1))

    def stop_all(self) -> None:
        for inst in list(self.instances.values()):
            self.stop(inst, "kill")

    def tasks(self) -> list[asyncio.Task[None]]:
        return [i.task for i in self.instances.values() if i.task is not None]
