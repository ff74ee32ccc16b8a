"""In-process pieces for the sweep and study tests (``import sweep_helpers``; conftest.py registers it):
providers that stand in for workers.

``Box`` offers devices and records what it is asked to start (nothing runs). ``ScriptedBox`` plays a run
the way a run process reports it (``run_started``, ``metric`` events step by step, ``run_finished``), from
a script of the graph's learning rate, and stops when cancelled, so the study driver's pruning and
telling are exercised against the real dispatcher, store, hub and Optuna. The end-to-end tests run the
real thing (agents, run processes, digits).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any

from xpufleet.server.scheduling import DeviceOffer

CPU = DeviceOffer("cpu", "cpu")


class Box:
    """A worker stand-in: devices, online, starts nothing (runs stay assigned until the test ends them)."""

    def __init__(self, name: str, devices: list[str] | None = None, is_local: bool = False) -> None:
        self.name = name
        self.is_local = is_local
        self.online = True
        self.draining = False
        self._devices = [DeviceOffer(d) for d in (devices or ["cpu", "cuda:0"])]
        self.started: list[str] = []
        self.cancelled: list[str] = []

    def devices(self) -> list[DeviceOffer]:
        return list(self._devices)

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        self.started.append(run["id"])

    async def cancel(self, run_id: str) -> bool:
        self.cancelled.append(run_id)
        return True


Script = Callable[[dict[str, Any]], tuple[list[tuple[int, float]], dict[str, Any], str]]
"""graph -> ([(step, val_loss_step)], final_metrics, final status)."""


def lr_of(graph: dict[str, Any]) -> float:
    return float(next(n for n in graph.values() if n["class_type"] == "XPUOptimizer")["inputs"]["lr"])


def default_script(graph: dict[str, Any]) -> tuple[list[tuple[int, float]], dict[str, Any], str]:
    """Loss falls fastest at lr 0.01 (log scale); accuracy follows the last loss; lr above 0.5 diverges."""
    lr = lr_of(graph)
    if lr > 0.5:
        return [(10, 5.0)], {"val_loss_step": 5.0}, "failed"
    badness = abs(math.log10(lr) + 2.0)  # 0 at lr 0.01
    losses = [(10 * k, 2.0 * math.exp(-k / (1.0 + 3.0 * badness)) + 0.2 * badness) for k in range(1, 21)]
    final = losses[-1][1]
    return losses, {"val_loss_step": final, "val_accuracy": max(0.0, 1.0 - final / 2.5)}, "succeeded"


class ScriptedBox(Box):
    """Plays each run from ``script``: one metric event per ``tick`` seconds, stops when cancelled."""

    def __init__(self, name: str, host: Any, script: Script = default_script, tick: float = 0.02,
                 devices: list[str] | None = None) -> None:
        super().__init__(name, devices)
        self.host = host
        self.script = script
        self.tick = tick
        self._stop: dict[str, asyncio.Event] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.finished: dict[str, str] = {}

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        self.started.append(run["id"])
        self._stop[run["id"]] = asyncio.Event()
        self.tasks.append(asyncio.get_running_loop().create_task(self._play(run)))

    async def cancel(self, run_id: str) -> bool:
        self.cancelled.append(run_id)
        if run_id in self._stop:
            self._stop[run_id].set()
        return True

    async def _play(self, run: dict[str, Any]) -> None:
        run_id = run["id"]
        seq = 0

        def ev(type_: str, payload: dict[str, Any]) -> dict[str, Any]:
            nonlocal seq
            seq += 1
            return {"seq": seq, "type": type_, "payload": payload}

        self.host.run_process_started(run_id, pid=None)
        self.host.ingest(run_id, [ev("run_started", {"placement": "worker"})])
        losses, final, status = self.script(run["graph"])
        error = None if status == "succeeded" else "the loss diverged"
        for step, value in losses:
            try:
                await asyncio.wait_for(self._stop[run_id].wait(), self.tick)
            except asyncio.TimeoutError:
                self.host.ingest(run_id, [ev("metric", {"name": "val_loss_step", "value": value, "step": step})])
                continue
            status, error, final = "cancelled", "cancelled by request", {"val_loss_step": value}
            break
        self.finished[run_id] = status
        self.host.ingest(run_id, [ev("run_finished", {"status": status, "error": error, "final_metrics": final})])
