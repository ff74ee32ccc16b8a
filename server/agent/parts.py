"""The other workers' share of a run spread over workers (docs/architecture.md "ddp across workers").

A spread run is rank 0's worker's run (agent.py runs it like any run, with the layout of
server/run/spread.py). Every other worker gets ``start_part`` once rank 0 has opened its rendezvous
store: it starts its ranks at once, as one launcher group (follower ranks only: rank 0 alone reports),
and sends ``part_finished`` when every one of them has ended: succeeded, cancelled, a rank that failed
by itself (``failed_rank`` and the error naming it and this worker), or ranks that only lost their
peers. ``stop_part`` stops them (the sidecar sends it when another worker's ranks failed or rank 0 is
done). Parts are not runs of this worker: they are never in hello or heartbeats, and they end with the
agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...constants import RUN_STOP_GRACE_S
from ..devices import names as devnames
from ..devices import renumbering as devren
from ..run import ddp, spread
from ..run.launcher import GroupSpec, LaunchError, ProcessGroup, member_env
from ..run.spec import build_spec
from ..run.warm import default_starter
from ..workers import protocol
from .config import AgentConfig, agents_dir

log = logging.getLogger("xpufleet.agent")


@dataclass
class HostedPart:
    run_id: str
    layout: spread.Layout
    group: ProcessGroup | None = None
    task: asyncio.Task[None] | None = None
    stop: str | None = None


def part_dir(home: Path, worker: str, run_id: str, part: int) -> Path:
    """``agents/<name>/runs/<run id>-part<i>``: a part's run directory (spec, logs, events)."""
    safe = "".join(c for c in run_id if c.isalnum() or c in "-_") or "run"
    return agents_dir(home) / worker / "runs" / f"{safe}-part{part}"


class PartHost:
    """The spread-run parts one agent runs. Dependencies: the agent's config, a ``send`` callable (one frame to
    the sidecar), the devices the agent offers and whether its cards are simulated."""

    def __init__(self, cfg: AgentConfig, send: Callable[[str], Awaitable[bool]],
                 offered: Callable[[], list[dict[str, Any]]], simulated: bool) -> None:
        self.cfg = cfg
        self.send = send
        self.offered = offered
        self.simulated = simulated
        self.parts: dict[str, HostedPart] = {}

    async def handle(self, msg: dict[str, Any]) -> None:
        if msg["type"] == "start_part":
            await self.start(msg)
        else:
            hosted = self.parts.get(msg["run_id"])
            if hosted is not None:
                self._stop(hosted, "cancel")

    def _stop(self, hosted: HostedPart, reason: str) -> None:
        hosted.stop = hosted.stop or reason
        if hosted.group is not None:
            hosted.group.stop(reason)

    def stop_all(self) -> None:
        for hosted in self.parts.values():
            self._stop(hosted, "interrupt")

    def tasks(self) -> list[asyncio.Task[None]]:
        return [h.task for h in self.parts.values() if h.task is not None]

    async def start(self, msg: dict[str, Any]) -> None:
        run_id = msg["run_id"]
        if run_id in self.parts:
            return
        try:
            layout = spread.Layout.from_json(msg["spread"])
        except spread.LayoutError as exc:
            await self._report(run_id, -1, {"status": "failed", "error": f"worker {self.cfg.name}: {exc}"})
            return
        hosted = self.parts[run_id] = HostedPart(run_id, layout)
        hosted.task = asyncio.create_task(self._run(hosted, msg))

    async def _run(self, hosted: HostedPart, msg: dict[str, Any]) -> None:
        cfg, layout = self.cfg, hosted.layout
        try:
            outcome = await self._run_group(hosted, msg)
        except (devnames.DeviceSpecError, spread.LayoutError, LaunchError) as exc:
            outcome = {"status": "failed", "failed_rank": layout.here.first_rank,
                       "error": spread.failure_text(layout.here.first_rank, layout.world_size, cfg.name, str(exc))}
        except Exception as exc:  # the sidecar must hear how the part ended
            log.exception("run %s: part %d failed to run", hosted.run_id, layout.part)
            outcome = {"status": "failed", "failed_rank": layout.here.first_rank,
                       "error": spread.failure_text(layout.here.first_rank, layout.world_size, cfg.name,
                                                    f"the agent failed to run it: {type(exc).__name__}: {exc}")}
            if hosted.group is not None:
                hosted.group.kill()
        finally:
            self.parts.pop(hosted.run_id, None)
        await self._report(hosted.run_id, layout.part, outcome)

    async def _run_group(self, hosted: HostedPart, msg: dict[str, Any]) -> dict[str, Any]:
        cfg, layout = self.cfg, hosted.layout
        offered = {d["name"] for d in self.offered()}
        machine = [devnames.normalize_device(d) for d in layout.here.devices]
        missing = [d for d in machine if d not in offered]
        if missing:
            raise devnames.DeviceSpecError(f"worker {cfg.name} does not offer {', '.join(missing)}")
        renum = devren.renumber(machine)
        run_dir = part_dir(cfg.home, cfg.name, hosted.run_id, layout.part)
        simulated = self.simulated and any(devnames.device_kind(d) == "cuda" for d in machine)
        spec = build_spec({"id": hosted.run_id, "graph": msg["graph"], "options": msg.get("options") or {},
                           "budget_gib": msg.get("budget_gib")}, placement="worker", slot_devices=machine,
                          run_devices=renum.run_devices, aliases=renum.aliases, visible_devices=renum.run_devices,
                          env=renum.env, worker=cfg.name, simulated=simulated)
        spec.world_size = layout.world_size
        spec.spread = layout.to_json()
        spec.write(run_dir)
        extra = {**cfg.extra_env, **renum.env}
        parent = {**os.environ, **extra}
        extra.update(ddp.rank_env(spec.graph, spec.world_size, parent))
        extra.update(spread.socket_env(cfg.advertise_addr, parent))
        env = member_env(None, extra)
        group = hosted.group = ProcessGroup(
            GroupSpec(hosted.run_id, spread.members(run_dir, layout, env, layout.store), RUN_STOP_GRACE_S),
            on_events=lambda rank, events: None, starter=default_starter())
        await group.start()
        if hosted.stop is not None:  # stopped while starting
            group.stop(hosted.stop)
        log.info("run %s: ranks %d..%d started on %s (part %d)", hosted.run_id, layout.here.first_rank,
                 layout.rank_of(len(layout.here.devices) - 1), ", ".join(machine), layout.part)
        result = await group.wait()
        return spread.part_outcome(result, layout)

    async def _report(self, run_id: str, part: int, outcome: dict[str, Any]) -> None:
        log.info("run %s: part %d ended: %s", run_id, part, outcome.get("error") or outcome["status"])
        with contextlib.suppress(Exception):
            await self.send(protocol.encode("part_finished", run_id=run_id, part=part, **outcome))
