"""The sidecar's services (docs/services.md): create, describe, update (rolling), delete, and recovery after
a restart. One :class:`UnitManager` per sidecar, on its event loop, composed of parts with explicit
dependencies: the life of each unit is :class:`~.control.UnitControl`, the request path
:class:`~.router.Router`, the shared change signal and rank 0 client are in links.py. The registry
delivers the agents' messages to :meth:`UnitManager.message_handlers` and connection changes to
:meth:`UnitManager.on_connection` (wired where the manager is created: routes/services.py).

Instances share cards with runs through the dispatcher's slot system: each instance is a slot holder
queued with the runs in submission order (``Dispatcher.request_slots``), one card each.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ...common.errors import ApiError
from ...common.signals import cancel_and_wait
from ..scheduling import TargetError
from . import lifecycle as lc
from .control import HEALTH_INTERVAL_S, Slots, UnitControl, holder_id
from .links import Changes, RankClient, WorkerLinks
from .persist import UnitStore
from .records import Instance, Service, Unit, Update
from .rollout import UnitView, next_step
from .router import Router
from .spec import ServiceSpec, SpecError, parse_service

log = logging.getLogger("xpufleet.units")

HISTORY_SHOWN = 30


class UnitManager:
    """Every service of this sidecar, their units and instances (see the module docstring)."""

    def __init__(self, store: Any, dispatcher: Slots, workers: WorkerLinks) -> None:
        self.persist = UnitStore(store)
        self.services: dict[str, Service] = {}
        self.changes = Changes()
        self.client = RankClient()
        self.control = UnitControl(self.services, self.persist, dispatcher, workers, self.changes, self.client)
        self.router = Router(self.get, self.control, self.changes, self.client)
        self._rollouts: dict[str, asyncio.Task[None]] = {}
        self._monitor: asyncio.Task[None] | None = None

    def message_handlers(self) -> dict[str, Callable[[str, dict[str, Any]], Awaitable[None]]]:
        """The agents' messages about instances, by type, for the registry to deliver."""
        return {"instance_state": self.control.on_instance_state, "instances": self.control.on_instances}

    def on_connection(self, worker: str, online: bool) -> None:
        """A worker connected or disconnected (the registry's connection listener)."""
        self.control.on_connection(worker, online)

    def spec_of(self, unit: Unit) -> ServiceSpec:
        """The spec of ``unit``'s version."""
        return self.control.spec_of(unit)

    # --- lifecycle -------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Load the services and take their units over (instances on workers keep running)."""
        await self.client.open()
        for svc in self.persist.load():
            self.services[svc.name] = svc
            self._recover(svc)
        self._monitor = asyncio.create_task(self._monitor_loop(), name="xpufleet-units-monitor")

    def _recover(self, svc: Service) -> None:
        for unit in list(svc.units):
            if unit.state == "failed":
                continue
            for inst in unit.instances:
                if inst.worker is not None:
                    self.control.dispatcher.hold_slots(holder_id(unit, inst.rank), inst.worker, [inst.device])
                if inst.alive or inst.state == "starting":
                    inst.state = "starting"  # unconfirmed until its agent lists it
                    if not self.control.workers.online(inst.worker):
                        self.control.schedule_lost(inst.worker)
            if unit.state in ("draining", "stopping"):
                self.changes.spawn(self.control.stop_unit(unit, graceful=False, reason="it was being retired when the server stopped"))
            elif unit.state == "placing":
                self.control.place(unit, [i.rank for i in unit.instances if i.worker is None])
            elif unit.state in ("starting", "restarting"):
                unit.set_state("restarting", "the server restarted while this generation was starting")
                self.changes.spawn(self.control.restart_after(unit.id, unit.generation, 0.0))
            else:
                unit.healthy = False
                unit.set_state("recovering", "the server restarted; waiting for the agents to report the instances")
            unit.note("server_restarted")
        if svc.updating:
            self._start_rollout(svc)

    async def _monitor_loop(self) -> None:
        while True:
            await asyncio.sleep(HEALTH_INTERVAL_S)
            try:
                await self.control.monitor_once()
            except Exception:  # noqa: BLE001 - the monitor must go on
                log.exception("unit health monitor failed")

    async def close(self) -> None:
        """Server stopping: stop orchestrating. Instances keep running on their workers and are taken
        over by the next sidecar (like runs)."""
        self.control.cancel_timers()
        await cancel_and_wait([*self._rollouts.values(), *self.changes.tasks(), *([self._monitor] if self._monitor else [])])
        await self.client.close()

    # --- the API -----------------------------------------------------------------------------------------
    def get(self, name: str) -> Service:
        svc = self.services.get(name)
        if svc is None or svc.deleting:
            raise ApiError(404, f"no service named {name!r} (see GET /api/services)")
        return svc

    def _check_target(self, spec: Any) -> None:
        try:
            self.control.candidates(spec)
        except TargetError as exc:
            raise SpecError(f"target: {exc}") from None

    def create(self, body: Any) -> dict[str, Any]:
        """``POST /api/services``: every unit is placed and started at once."""
        spec = parse_service(body)
        if spec.name in self.services:
            raise ApiError(409, f"service {spec.name!r} exists: PUT /api/services/{spec.name} updates it "
                                f"(a rolling update), DELETE removes it")
        self._check_target(spec)
        svc = Service(name=spec.name, version=1, specs={1: spec})
        self.services[svc.name] = svc
        self.persist.save_service(svc)
        for _ in range(spec.replicas):
            self._new_unit(svc, 1)
        log.info("service %s created: %d unit(s) of %d", svc.name, spec.replicas, spec.size)
        return self.describe(svc)

    def _new_unit(self, svc: Service, version: int) -> Unit:
        spec = svc.specs[version]
        svc.unit_serial += 1
        unit = Unit(id=f"{svc.name}-{svc.unit_serial}", service=svc.name, version=version, index=svc.unit_serial,
                    instances=[Instance(rank=r) for r in range(spec.size)])
        svc.units.append(unit)
        self.persist.save_service(svc, with_units=False)
        unit.note("created", version=version)
        self.control.place(unit)
        return unit

    def update(self, name: str, body: Any) -> dict[str, Any]:
        """``PUT /api/services/{name}``: a rolling update to the new spec (202; GET shows its progress)."""
        svc = self.get(name)
        if svc.updating:
            raise ApiError(409, f"service {name!r} is being updated (version {svc.update.to_version}); wait for "
                                f"it to finish (GET /api/services/{name}, update.state)")
        spec = parse_service(body, name)
        self._check_target(spec)
        if spec == svc.spec and not any(u.state == "failed" for u in svc.units):
            return {**self.describe(svc), "unchanged": True}  # (the same spec still replaces failed units)
        version = max(svc.specs) + 1
        svc.specs[version] = spec
        svc.update = Update("rolling", from_version=svc.version, to_version=version)
        svc.version = version
        svc.updated_at = time.time()
        self.persist.save_service(svc, with_units=False)
        log.info("service %s: rolling update to version %d", name, version)
        self._start_rollout(svc)
        return self.describe(svc)

    def _start_rollout(self, svc: Service) -> None:
        old = self._rollouts.get(svc.name)
        if old is None or old.done():
            self._rollouts[svc.name] = asyncio.get_running_loop().create_task(self._rollout(svc))

    async def _rollout(self, svc: Service) -> None:
        """Execute the planner's steps until the update is done or rolled back (rollout.py)."""
        while svc.update is not None and svc.updating and not svc.deleting:
            spec = svc.spec
            views = [UnitView(u.id, u.version, u.state, u.index, u.state_since if u.ever_ready else u.created_at,
                              u.detail) for u in svc.units]
            step = next_step(views, svc.version, spec.replicas, time.time(), spec.ready_timeout_s)
            upd = svc.update
            if step.action == "done":
                upd.state = "done" if upd.state == "rolling" else "rolled_back"
                upd.finished_at = time.time()
                used = {u.version for u in svc.units} | {svc.version, upd.from_version}
                svc.specs = {v: s for v, s in svc.specs.items() if v in used}
                log.info("service %s: update %s", svc.name, upd.state.replace("_", " "))
            elif step.action == "start":
                self._new_unit(svc, svc.version)
            elif step.action == "retire":
                unit = svc.unit(step.unit_id or "")
                if unit is not None:
                    await self.control.retire(unit, f"replaced by version {svc.version} (rolling update)")
            elif step.action == "abort":
                unit = svc.unit(step.unit_id or "")
                if unit is not None:
                    await self.control.stop_unit(unit, graceful=False, reason=step.reason)
                if upd.state == "rolling":
                    log.warning("service %s: update to version %d rolled back: %s", svc.name, upd.to_version,
                                step.reason)
                    upd.state, upd.reason, svc.version = "rolling_back", step.reason, upd.from_version
                else:
                    upd.state, upd.finished_at = "failed", time.time()
                    upd.reason = f"{upd.reason}; the rollback did not finish either: {step.reason}"
            else:
                await self.changes.wait_for(lambda: False, 1.0)  # until something changes (or 1 s for timeouts)
                continue
            self.persist.save_service(svc, with_units=False)
            self.changes.notify()

    async def delete(self, name: str) -> dict[str, Any]:
        """``DELETE /api/services/{name}``: no new requests; every unit drains and stops; the records go."""
        svc = self.get(name)
        svc.deleting = True
        task = self._rollouts.pop(name, None)
        if task is not None:
            await cancel_and_wait([task])
        units = list(svc.units)
        await asyncio.gather(*(self.control.retire(u, "the service is being deleted") for u in units if u.state != "failed"),
                             *(self.control.stop_unit(u, graceful=False, reason="the service is being deleted")
                               for u in units if u.state == "failed"))
        self.services.pop(name, None)
        self.persist.delete_service(name)
        self.changes.notify()
        log.info("service %s deleted", name)
        return {"deleted": name, "units": [u.id for u in units]}

    # --- descriptions ------------------------------------------------------------------------------------
    def describe(self, svc: Service, history: bool = True) -> dict[str, Any]:
        spec = svc.spec
        return {
            "name": svc.name,
            "state": lc.service_state([u.state for u in svc.units], spec.replicas, svc.updating),
            "version": svc.version,
            "spec": spec.to_json(),
            "replicas": spec.replicas,
            "ready_units": sum(1 for u in svc.units if u.state == "ready"),
            "units": [self._describe_unit(u, history) for u in svc.units],
            "update": svc.update.to_json() if svc.update else None,
            "created_at": svc.created_at,
            "updated_at": svc.updated_at,
        }

    def _describe_unit(self, u: Unit, history: bool) -> dict[str, Any]:
        spec = self.spec_of(u)
        out = {
            "id": u.id, "index": u.index, "version": u.version, "state": u.state, "detail": u.detail,
            "ready": u.state == "ready", "generation": u.generation, "barrier_passed": u.barrier_passed,
            "guard": spec.guard, "size": spec.size, "rendezvous": u.rendezvous,
            "master_addr": u.master_addr, "master_port": u.master_port,
            "restarts_in_window": len(lc.restarts_in_window(u.restart_times, time.time(), spec.restart.window_s)),
            "restart_budget": lc.budget_text(spec.restart), "failed_reason": u.failed_reason,
            "outstanding": u.outstanding, "routed": u.routed, "created_at": u.created_at,
            "instances": [{
                "rank": i.rank, "worker": i.worker, "device": i.device, "pid": i.pid, "generation": i.generation,
                "attempt": i.attempt, "state": i.state, "restarts": i.restarts, "last_exit": i.last_exit,
                "port": i.port, "env": i.env, "waiting_reason": i.waiting_reason,
            } for i in u.instances],
        }
        if history:
            out["history"] = u.history[-HISTORY_SHOWN:]
        return out

    def list(self) -> list[dict[str, Any]]:
        return [self.describe(s, history=False) for s in self.services.values() if not s.deleting]
