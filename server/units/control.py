"""The life of one unit on the sidecar (docs/services.md): placement, generations, the barrier,
readiness, guard restarts with the restart budget, and stopping. A component of
:class:`~.manager.UnitManager` with explicit dependencies (the services table, the unit store, the slot
system, the links to workers, the change signal and the rank 0 client).

A generation starts all instances in parallel: rank 0's agent picks ``MASTER_PORT`` (and answers with
it before it spawns), the other ranks are sent the moment it is known. Each generation has a fresh
rendezvous key. An instance reports ``running``, then ``arrived`` when it reached the unit's barrier;
once every instance arrived and rank 0 answers its health check the unit is ``ready`` and routable.
Anything else takes it out of routing at once.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any, Protocol

from ...constants import LOCAL_PROVIDER
from ..scheduling import Candidate, RunTarget, TargetError
from ..workers import protocol
from . import lifecycle as lc
from .envcontract import instance_env
from .links import Changes, RankClient, WorkerLinks
from .persist import UnitStore
from .records import Instance, Service, Unit
from .spec import ServiceSpec

log = logging.getLogger("xpufleet.units")

STOP_WAIT_S = 10.0  # how long a restart waits for the old instances' exits before it goes on
HEALTH_TIMEOUT_S = 2.0
HEALTH_INTERVAL_S = 5.0  # a ready unit's rank 0 is checked this often
HEALTH_FAILURES = 3  # consecutive failed checks that count as rank 0 failing


def holder_id(unit: Unit, rank: int) -> str:
    """The slot holder of one instance in the dispatcher's slot system."""
    return f"unit:{unit.id}/{rank}"


class Slots(Protocol):
    """The dispatcher's slot system, as the units use it (instances hold cards like runs)."""

    def resolve(self, target: RunTarget) -> Any: ...

    def request_slots(self, holder: str, candidates: list[Candidate], on_placed: Callable[..., None],
                      on_reason: Callable[..., None]) -> None: ...

    def hold_slots(self, holder: str, provider: str, devices: list[str]) -> None: ...

    def release_slots(self, holder: str) -> None: ...


class UnitControl:
    """Per-unit orchestration (see the module docstring)."""

    def __init__(self, services: dict[str, Service], persist: UnitStore, slots: Slots, workers: WorkerLinks,
                 changes: Changes, client: RankClient) -> None:
        self.services = services  # shared with the manager, which adds and removes services
        self.persist = persist
        self.dispatcher = slots
        self.workers = workers
        self.changes = changes
        self.client = client
        self._timers: dict[str, asyncio.TimerHandle] = {}  # ready timeouts, per unit
        self._lost_timers: dict[str, asyncio.TimerHandle] = {}  # resume grace, per worker
        self._checking: set[str] = set()  # units whose rank 0 health is being polled
        self._misses: dict[str, int] = {}  # consecutive failed health checks, per ready unit

    def changed(self, unit: Unit | None = None) -> None:
        """``unit`` (saved while it belongs to its service) or something else changed: wake the waiters."""
        if unit is not None:
            svc = self.services.get(unit.service)
            if svc is not None and unit in svc.units:
                self.persist.save_unit(unit)
        self.changes.notify()

    def cancel_timers(self) -> None:
        """Server stopping: no timeout fires any more."""
        for handle in [*self._timers.values(), *self._lost_timers.values()]:
            handle.cancel()

    # --- lookups -----------------------------------------------------------------------------------
    def _find(self, unit_id: str) -> tuple[Service, Unit] | None:
        name = unit_id.rsplit("-", 1)[0]
        svc = self.services.get(name)
        unit = svc.unit(unit_id) if svc is not None else None
        return (svc, unit) if unit is not None else None

    def spec_of(self, unit: Unit) -> ServiceSpec:
        return self.services[unit.service].specs[unit.version]

    def _stop(self, unit: Unit, inst: Instance, mode: str, grace_s: float = 0.0) -> None:
        self.changes.spawn(self.workers.send(inst.worker, "stop_instance", unit_id=unit.id, rank=inst.rank, mode=mode,
                               grace_s=grace_s))

    # --- placement -----------------------------------------------------------------------------------
    def candidates(self, spec: ServiceSpec) -> list[Candidate]:
        """Cards an instance of ``spec`` may take (one each): the target's candidates on workers.
        Raises TargetError (400 at submission) when no worker offers the device."""
        device = None if spec.device == "auto" else spec.device
        res = self.dispatcher.resolve(RunTarget(worker=spec.worker, device=device))
        cands = [c for c in res.candidates if c.provider != LOCAL_PROVIDER]
        if not cands:
            raise TargetError(f"no worker seen since the server started offers {spec.device} (service instances run "
                              f"on worker agents)")
        return cands

    def place(self, unit: Unit, ranks: list[int] | None = None) -> None:
        """Queue the instances without a card in the slot system (with the runs, in submission order)."""
        spec = self.spec_of(unit)
        try:
            cands = self.candidates(spec)
        except TargetError as exc:
            unit.set_state("placing", f"waiting for a worker: {exc}")
            self._retry_placement_later(unit)
            return
        unit.set_state("placing", f"waiting for {spec.size} card(s)")
        for inst in unit.instances:
            if ranks is not None and inst.rank not in ranks:
                continue
            inst.worker = inst.device = None
            inst.state = "waiting"
            self.dispatcher.request_slots(holder_id(unit, inst.rank), cands,
                                          on_placed=functools.partial(self._placed, unit.id, inst.rank),
                                          on_reason=functools.partial(self._waiting, unit.id, inst.rank))
        self.changed(unit)

    def _retry_placement_later(self, unit: Unit) -> None:
        async def retry() -> None:
            await asyncio.sleep(2.0)
            found = self._find(unit.id)
            if found and found[1].state == "placing" and all(i.worker is None for i in found[1].instances):
                self.place(found[1])
        self.changes.spawn(retry())

    def _waiting(self, unit_id: str, rank: int, reason: str | None) -> None:
        found = self._find(unit_id)
        if found:
            found[1].instances[rank].waiting_reason = reason

    def _placed(self, unit_id: str, rank: int, provider: str, devices: tuple[str, ...]) -> None:
        found = self._find(unit_id)
        if found is None or found[1].state != "placing":
            self.dispatcher.release_slots(f"unit:{unit_id}/{rank}")
            return
        unit = found[1]
        inst = unit.instances[rank]
        inst.worker, inst.device, inst.waiting_reason = provider, devices[0], None
        unit.note("placed", rank=rank, worker=provider, device=devices[0])
        if all(i.worker is not None for i in unit.instances):
            self._start_generation(unit)
        else:
            self.changed(unit)

    def _release(self, unit: Unit) -> None:
        for inst in unit.instances:
            self.dispatcher.release_slots(holder_id(unit, inst.rank))

    # --- generations ------------------------------------------------------------------------------------
    def _start_generation(self, unit: Unit) -> None:
        """Start every instance of a new generation (fresh rendezvous); rank 0 first picks MASTER_PORT."""
        away = [i.rank for i in unit.instances if not self.workers.online(i.worker)]
        if away:  # their worker is gone: those instances go back to the slot queue
            for rank in away:
                self.dispatcher.release_slots(holder_id(unit, rank))
            self.place(unit, away)
            return
        unit.generation += 1
        unit.barrier_passed = unit.healthy = False
        unit.rendezvous = f"{unit.id}-g{unit.generation}-{secrets.token_hex(4)}"
        unit.master_addr = unit.master_port = None
        for inst in unit.instances:
            if inst.generation:
                inst.restarts += 1
            inst.generation, inst.attempt, inst.state = unit.generation, 0, "starting"
            inst.pid = inst.port = inst.sent_at = None
            inst.env = {}
        unit.set_state("starting", f"generation {unit.generation}: starting {len(unit.instances)} instance(s)")
        unit.note("generation_started", workers=[f"{i.worker}/{i.device}" for i in unit.instances])
        self._arm_ready_timer(unit)
        self.changes.spawn(self._send_start(unit, unit.instances[0], pick_ports=True))
        self.changed(unit)

    async def _send_start(self, unit: Unit, inst: Instance, pick_ports: bool) -> None:
        spec = self.spec_of(unit)
        env = instance_env(service=unit.service, unit_id=unit.id, generation=unit.generation, rank=inst.rank,
                           size=spec.size, master_addr=unit.master_addr or "", master_port=unit.master_port or 0,
                           rendezvous=unit.rendezvous or "")
        gen, attempt = inst.generation, inst.attempt
        inst.sent_at = time.time()
        ok = await self.workers.send(inst.worker, "start_instance", unit_id=unit.id, service=unit.service, rank=inst.rank,
                              size=spec.size, generation=gen, attempt=attempt, device=inst.device,
                              program=spec.to_json()["program"], env=env, pick_ports=pick_ports)
        if not ok and (inst.generation, inst.attempt, inst.state) == (gen, attempt, "starting"):
            inst.state = "exited"
            self._on_exit(unit, inst, f"could not be sent to worker {inst.worker} (disconnected)")

    def _arm_ready_timer(self, unit: Unit) -> None:
        self._cancel_timer(unit)
        spec = self.spec_of(unit)
        loop = asyncio.get_running_loop()
        self._timers[unit.id] = loop.call_later(spec.ready_timeout_s, self._ready_timeout, unit.id, unit.generation)

    def _cancel_timer(self, unit: Unit) -> None:
        handle = self._timers.pop(unit.id, None)
        if handle is not None:
            handle.cancel()

    def _ready_timeout(self, unit_id: str, generation: int) -> None:
        self._timers.pop(unit_id, None)
        found = self._find(unit_id)
        if found is None:
            return
        unit = found[1]
        if unit.generation == generation and unit.state == "starting":
            arrived = sum(1 for i in unit.instances if i.state == "arrived")
            why = (f"generation {generation} did not become ready within {self.spec_of(unit).ready_timeout_s:g} s "
                   f"({arrived} of {len(unit.instances)} instance(s) at the barrier)")
            unit.note("ready_timeout", reason=why)
            self._restart_unit(unit, why)

    # --- what agents report --------------------------------------------------------------------------------
    async def on_instance_state(self, worker: str, msg: dict[str, Any]) -> None:
        found = self._find(msg["unit_id"])
        state = msg["state"]
        if found is None or msg["rank"] >= len(found[1].instances):
            if state != "exited":  # a process the server no longer wants
                await self.workers.send(worker, "stop_instance", unit_id=msg["unit_id"], rank=msg["rank"], mode="kill")
            return
        unit = found[1]
        inst = unit.instances[msg["rank"]]
        current = (msg["generation"], msg["attempt"]) == (inst.generation, inst.attempt) and inst.worker == worker
        if not current or unit.state == "failed" and state != "exited":
            if state != "exited":
                await self.workers.send(worker, "stop_instance", unit_id=unit.id, rank=inst.rank, mode="kill")
            return
        if state == "starting":
            inst.port = msg.get("port") or inst.port
            if inst.rank == 0 and msg.get("master_port") and unit.master_port is None:
                unit.master_port = msg["master_port"]
                unit.master_addr = msg.get("address") or "127.0.0.1"
                for other in unit.instances[1:]:
                    if other.state == "starting" and other.generation == unit.generation:
                        self.changes.spawn(self._send_start(unit, other, pick_ports=False))
        elif state == "running":
            inst.pid = msg.get("pid") or inst.pid
            inst.port = msg.get("port") or inst.port
            inst.started_at = time.time()
            if inst.state != "arrived":
                inst.state = "running"
        elif state == "arrived":
            inst.state = "arrived"
            inst.env = dict(msg.get("env") or {})
            inst.pid = msg.get("pid") or inst.pid
            if not unit.barrier_passed and lc.barrier_passed([i.state for i in unit.instances]):
                unit.barrier_passed = True
                unit.note("barrier_passed")
        else:
            inst.state = "exited"
            inst.last_exit = msg.get("cause") or lc.exit_cause(msg.get("returncode"))
            self._on_exit(unit, inst, inst.last_exit)
        self._check_ready(unit)
        self.changed(unit)

    def _on_exit(self, unit: Unit, inst: Instance, cause: str) -> None:
        """An instance of the current generation ended."""
        if unit.state in ("restarting", "draining", "stopping", "failed"):
            self.changed(unit)
            return  # expected: the unit is ending it
        unit.note("instance_failed", rank=inst.rank, cause=cause)
        log.warning("unit %s: rank %d %s", unit.id, inst.rank, cause)
        spec = self.spec_of(unit)
        if lc.failure_action(spec.guard, inst.rank) == lc.RESTART_UNIT:
            self._restart_unit(unit, f"rank {inst.rank} {cause}")
        else:
            self._restart_instance(unit, inst, cause)

    # --- guard, restarts and the budget --------------------------------------------------------------------
    def _budget(self, unit: Unit, reason: str) -> float | None:
        spec = self.spec_of(unit)
        now = time.time()
        unit.restart_times = lc.restarts_in_window(unit.restart_times, now, spec.restart.window_s)
        delay = lc.next_restart_delay(spec.restart, unit.restart_times, now)
        if delay is None:
            self._fail(unit, f"the restart budget ({lc.budget_text(spec.restart)}) is spent; last failure: {reason}")
            return None
        unit.restart_times.append(now)
        return delay

    def _restart_unit(self, unit: Unit, reason: str) -> None:
        """End every instance, then (after the backoff) start a new generation on the same cards."""
        delay = self._budget(unit, reason)
        if delay is None:
            return
        self._cancel_timer(unit)
        unit.barrier_passed = unit.healthy = False
        unit.set_state("restarting", f"{reason}; generation {unit.generation + 1} in {delay:g} s")
        unit.note("restarting", reason=reason, delay_s=delay)
        for inst in unit.instances:
            if inst.alive or inst.state == "starting":
                self._stop(unit, inst, "kill")
        self.changes.spawn(self.restart_after(unit.id, unit.generation, delay))
        self.changed(unit)

    async def restart_after(self, unit_id: str, generation: int, delay: float) -> None:
        started = time.monotonic()
        found = self._find(unit_id)
        if found is None:
            return
        unit = found[1]
        await self.changes.wait_for(lambda: not any(i.alive or i.state == "starting" for i in unit.instances), STOP_WAIT_S)
        await asyncio.sleep(max(0.0, delay - (time.monotonic() - started)))
        if self._find(unit_id) and unit.state == "restarting" and unit.generation == generation:
            self._start_generation(unit)

    def _restart_instance(self, unit: Unit, inst: Instance, cause: str) -> None:
        """Guard off, rank > 0: that instance restarts alone (same generation and rendezvous)."""
        delay = self._budget(unit, f"rank {inst.rank} {cause}")
        if delay is None:
            return
        unit.healthy = False
        unit.set_state("recovering", f"rank {inst.rank} {cause}; restarting it alone in {delay:g} s (guard off)")
        unit.note("restarting_instance", rank=inst.rank, delay_s=delay)
        self.changes.spawn(self._restart_instance_after(unit.id, inst.rank, inst.generation, inst.attempt, delay))
        self.changed(unit)

    async def _restart_instance_after(self, unit_id: str, rank: int, generation: int, attempt: int,
                                      delay: float) -> None:
        await asyncio.sleep(delay)
        found = self._find(unit_id)
        if found is None:
            return
        unit = found[1]
        inst = unit.instances[rank]
        if unit.state != "recovering" or (inst.generation, inst.attempt, inst.state) != (generation, attempt, "exited"):
            return
        inst.attempt += 1
        inst.restarts += 1
        inst.state, inst.pid = "starting", None
        self.changes.spawn(self._send_start(unit, inst, pick_ports=False))
        self.changed(unit)

    def _fail(self, unit: Unit, reason: str) -> None:
        """The budget is spent: the unit stays visible as ``failed``; its processes end, its cards are freed."""
        self._cancel_timer(unit)
        unit.barrier_passed = unit.healthy = False
        unit.failed_reason = reason
        unit.set_state("failed", reason)
        unit.note("failed", reason=reason)
        log.error("unit %s failed: %s", unit.id, reason)
        for inst in unit.instances:
            if inst.alive or inst.state == "starting":
                self._stop(unit, inst, "kill")

        async def free() -> None:
            await self.changes.wait_for(lambda: not any(i.alive or i.state == "starting" for i in unit.instances), STOP_WAIT_S)
            if unit.state == "failed":
                self._release(unit)
        self.changes.spawn(free())
        self.changed(unit)

    # --- readiness ---------------------------------------------------------------------------------------------
    def rank0_url(self, unit: Unit, path: str) -> str:
        inst = unit.instances[0]
        return f"http://{unit.master_addr or '127.0.0.1'}:{inst.port}{path}"

    def _check_ready(self, unit: Unit) -> None:
        states = [i.state for i in unit.instances]
        if lc.may_become_ready(unit.state, states, unit.barrier_passed) and unit.id not in self._checking:
            self._checking.add(unit.id)
            self.changes.spawn(self._become_ready(unit, unit.generation))

    async def _become_ready(self, unit: Unit, generation: int) -> None:
        """Poll rank 0's health check until it answers; then the unit is ready (routable)."""
        spec = self.spec_of(unit)
        delay = 0.02
        deadline = time.monotonic() + spec.ready_timeout_s
        try:
            while time.monotonic() < deadline:
                if unit.generation != generation or not lc.may_become_ready(
                        unit.state, [i.state for i in unit.instances], unit.barrier_passed):
                    return
                if await self.client.status(self.rank0_url(unit, spec.health_path), HEALTH_TIMEOUT_S) == 200:
                    if unit.generation == generation and unit.state in ("starting", "recovering"):
                        self._cancel_timer(unit)
                        unit.healthy = True
                        unit.ever_ready = True
                        unit.set_state("ready")
                        unit.note("ready")
                        log.info("unit %s ready (generation %d)", unit.id, generation)
                        self.changed(unit)
                    return
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
            if unit.generation == generation and unit.state == "recovering":  # ("starting" has its own timer)
                self._restart_unit(unit, f"rank 0 did not answer its health check within {spec.ready_timeout_s:g} s")
        finally:
            self._checking.discard(unit.id)

    def rank0_unreachable(self, unit: Unit, why: str) -> None:
        """The router could not reach rank 0: out of routing until its health check answers again."""
        if unit.state != "ready":
            return
        unit.healthy = False
        unit.set_state("recovering", f"rank 0 unreachable: {why}")
        unit.note("rank0_unreachable", reason=why)
        self._check_ready(unit)
        self.changed(unit)

    async def monitor_once(self) -> None:
        """Check rank 0 of every ready unit; after HEALTH_FAILURES misses rank 0 counts as failed."""
        for svc in list(self.services.values()):
            for unit in list(svc.units):
                if unit.state != "ready":
                    continue
                status = await self.client.status(self.rank0_url(unit, self.spec_of(unit).health_path), HEALTH_TIMEOUT_S)
                misses = 0 if status == 200 else self._misses.get(unit.id, 0) + 1
                self._misses[unit.id] = misses
                if misses >= HEALTH_FAILURES and unit.state == "ready":
                    self._misses.pop(unit.id, None)
                    self._restart_unit(unit, f"rank 0 did not answer its health check {HEALTH_FAILURES} times")

    # --- stopping -------------------------------------------------------------------------------------------------
    async def stop_unit(self, unit: Unit, graceful: bool, reason: str) -> None:
        """End every instance (graceful: SIGTERM, killed after the drain timeout), free the cards, delete it."""
        spec = self.spec_of(unit)
        self._cancel_timer(unit)
        unit.set_state("stopping", reason)
        unit.note("stopping", reason=reason)
        grace = spec.drain_timeout_s if graceful else 0.0
        for inst in unit.instances:
            if inst.alive or inst.state == "starting":
                self._stop(unit, inst, "graceful" if graceful else "kill", grace)
        self.changed(unit)
        await self.changes.wait_for(lambda: not any(i.alive or i.state == "starting" for i in unit.instances),
                             grace + STOP_WAIT_S)
        self._release(unit)
        svc = self.services.get(unit.service)
        if svc is not None and unit in svc.units:
            svc.units.remove(unit)
        self.persist.delete_unit(unit.id)
        self.changed()

    async def retire(self, unit: Unit, reason: str) -> None:
        """Out of routing, let its in-flight requests finish (bounded), then stop it gracefully."""
        spec = self.spec_of(unit)
        unit.set_state("draining", reason)
        unit.note("draining", reason=reason, outstanding=unit.outstanding)
        self.changed(unit)
        await self.changes.wait_for(lambda: unit.outstanding == 0, spec.drain_timeout_s)
        await self.stop_unit(unit, graceful=True, reason=reason)

    # --- workers coming and going ------------------------------------------------------------------------------
    def on_connection(self, worker: str, online: bool) -> None:
        """A worker's connection ended: its units leave routing until its agent reports their instances;
        after the resume grace its instances count as lost."""
        if online:
            return
        touched = False
        for unit in self._units_on(worker):
            for inst in unit.instances:
                if inst.worker == worker and (inst.alive or inst.state == "starting"):
                    inst.state = "starting"  # unconfirmed until the agent reports it again
                    touched = True
            if unit.state in ("ready", "starting", "recovering"):
                unit.healthy = False
                unit.set_state("recovering", f"worker {worker} disconnected; waiting for its agent")
                unit.note("worker_disconnected", worker=worker)
            self.changed(unit)
        if touched:
            self.schedule_lost(worker)

    def schedule_lost(self, worker: str) -> None:
        if worker in self._lost_timers:
            return
        loop = asyncio.get_running_loop()
        self._lost_timers[worker] = loop.call_later(protocol.resume_grace_s(), self._worker_lost, worker)

    def _worker_lost(self, worker: str) -> None:
        self._lost_timers.pop(worker, None)
        if self.workers.online(worker):
            return
        grace = protocol.resume_grace_s()
        for unit in self._units_on(worker):
            lost = [i for i in unit.instances if i.worker == worker and i.state == "starting"]
            for inst in lost:
                inst.state = "lost"
                inst.last_exit = f"worker {worker} stayed away longer than the resume grace ({grace:g} s)"
            if lost and unit.state not in ("failed", "stopping", "draining"):
                unit.note("instances_lost", worker=worker, ranks=[i.rank for i in lost])
                self._restart_unit(unit, lost[0].last_exit or "")
            self.changed(unit)

    def _units_on(self, worker: str) -> list[Unit]:
        return [u for svc in self.services.values() for u in svc.units
                if any(i.worker == worker for i in u.instances)]

    async def on_instances(self, worker: str, msg: dict[str, Any]) -> None:
        """After welcome: the instances the agent runs. Ours are taken over, others stopped; ours that it
        does not list have ended."""
        handle = self._lost_timers.pop(worker, None)
        if handle is not None:
            handle.cancel()
        seen: set[tuple[str, int]] = set()
        for entry in msg["instances"]:
            found = self._find(entry["unit_id"])
            inst = found[1].instances[entry["rank"]] if found and entry["rank"] < len(found[1].instances) else None
            if (found is None or inst is None or inst.worker != worker
                    or found[1].state in ("failed", "stopping", "restarting")
                    or (entry["generation"], entry["attempt"]) != (inst.generation, inst.attempt)):
                await self.workers.send(worker, "stop_instance", unit_id=entry["unit_id"], rank=entry["rank"], mode="kill")
                continue
            unit = found[1]
            seen.add((unit.id, inst.rank))
            inst.pid = entry.get("pid") or inst.pid
            inst.port = entry.get("port") or inst.port
            if entry["state"] in ("running", "arrived"):
                inst.state = entry["state"]
            if inst.rank == 0 and entry.get("master_port"):
                unit.master_port = entry["master_port"]
        opened = self.workers.opened(worker)
        for unit in self._units_on(worker):
            for inst in unit.instances:
                # sent before this connection opened and not listed: it ended while we were apart
                if inst.worker == worker and inst.state == "starting" and (unit.id, inst.rank) not in seen \
                        and inst.sent_at is not None and inst.sent_at < opened:
                    inst.state = "exited"
                    inst.last_exit = f"the agent on worker {worker} no longer runs it (it was restarted)"
                    self._on_exit(unit, inst, inst.last_exit)
            if unit.state == "recovering" and not unit.barrier_passed and lc.barrier_passed(
                    [i.state for i in unit.instances]):
                unit.barrier_passed = True
            self._check_ready(unit)
            self.changed(unit)
