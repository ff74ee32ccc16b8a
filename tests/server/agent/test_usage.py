"""Per-run memory from NVML's per-process figures (beyond docs/workers.md: the actual use beside the budget), with
a stand-in for nvidia-ml-py (no GPU here) and real processes: a run's process and its descendants count."""

from __future__ import annotations

import subprocess
import sys
import time
import types
from typing import Any

import psutil

from xpufleet.server.agent.usage import run_memory, run_pids
from xpufleet.server.devices.inventory import Inventory

GIB = 1024**3


def fake_nvml(procs_by_card: dict[int, list[tuple[int, int | None]]]) -> types.ModuleType:
    """Two cards; ``procs_by_card``: card index -> (pid, used bytes or None) NVML lists as running there."""
    mod = types.ModuleType("pynvml")
    mod.nvmlInit = lambda: None
    mod.nvmlDeviceGetCount = lambda: 2
    mod.nvmlDeviceGetHandleByIndex = lambda i: i
    mod.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    mod.nvmlDeviceGetName = lambda h: "NVIDIA stand-in"
    mod.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(total=24 * GIB, free=10 * GIB, used=0)
    mod.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in procs_by_card.get(h, [])]

    def graphics(h: int) -> Any:
        raise RuntimeError("not supported (stand-in)")

    mod.nvmlDeviceGetGraphicsRunningProcesses = graphics
    return mod


class _Run:
    """What the agent keeps of a run: its launcher group's member pids."""

    def __init__(self, run_id: str, *pids: int, finished: bool = False) -> None:
        self.run_id, self.group, self.finished = run_id, types.SimpleNamespace(pids=list(pids)), finished


def test_a_runs_processes_and_their_descendants_are_counted_per_card(tmp_path, monkeypatch):
    # a real run process that starts a child of its own (as a ddp run starts its ranks)
    code = ("import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']);"
            " print(c.pid, flush=True); time.sleep(60)")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child_pid = int(parent.stdout.readline())
        other = psutil.Process().pid  # a process of someone else on the card: not the run's
        procs = {0: [(parent.pid, 2 * GIB), (other, 5 * GIB)], 1: [(child_pid, 3 * GIB), (parent.pid, None)]}
        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(procs))
        inv = Inventory("real", tmp_path, env={})
        inv.snapshot()  # the heartbeat's probe names the cards
        runs = [_Run("r1", parent.pid), _Run("done", other, finished=True)]
        assert run_pids(runs)["r1"] >= {parent.pid, child_pid} and "done" not in run_pids(runs)
        assert run_memory(inv, runs) == {"r1": {"cuda:0": 2.0, "cuda:1": 3.0}}
        # --devices limits what the agent offers, and what it reports
        only = Inventory("real", tmp_path, devices=["cuda:1"], env={})
        only.snapshot()
        assert run_memory(only, runs) == {"r1": {"cuda:1": 3.0}}
    finally:
        for p in psutil.Process(parent.pid).children(recursive=True):
            p.kill()
        parent.kill()
        parent.wait(10)
        time.sleep(0)


def test_simulated_cards_and_machines_without_nvml_report_nothing(tmp_path, monkeypatch):
    from xpufleet.server.devices.simulated import parse_simulate

    sim = Inventory("sim", tmp_path, simulate=parse_simulate("cuda:0=24", "sim"))
    assert run_memory(sim, [_Run("r1", 1)]) == {}
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py missing
    plain = Inventory("plain", tmp_path, env={})
    plain.snapshot()
    assert run_memory(plain, [_Run("r1", psutil.Process().pid)]) == {}


def test_a_comfyui_runs_instance_counts_as_the_runs(tmp_path, monkeypatch):
    instance = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setitem(sys.modules, "pynvml", fake_nvml({1: [(instance.pid, 4 * GIB)]}))
        inv = Inventory("real", tmp_path, env={})
        inv.snapshot()
        run = _Run("r1", psutil.Process().pid)
        run.extra_pids = [instance.pid]  # type: ignore[attr-defined]  # the agent's ComfyUI instance of the run
        assert run_memory(inv, [run]) == {"r1": {"cuda:1": 4.0}}
    finally:
        instance.kill()
        instance.wait(10)
