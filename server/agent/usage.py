"""What each run on this agent uses per card, from NVML's per-process figures (beyond seed 000's
limits: the ledger counts budgets; this shows the actual use beside them). Real NVIDIA cards only:
simulated cards have no such figure and none is made up."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any


def run_pids(runs: Iterable[Any]) -> dict[str, set[int]]:
    """Each running run's process and its descendants (a ddp run's ranks): whose NVML figures count."""
    import psutil

    out: dict[str, set[int]] = {}
    for rs in list(runs):
        pid = getattr(rs.proc, "pid", None)
        if rs.finished or pid is None or getattr(rs.proc, "returncode", None) is not None:
            continue
        pids = {pid}
        with contextlib.suppress(psutil.Error):
            pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
        out[rs.run_id] = pids
    return out


def run_memory(inventory: Any, runs: Iterable[Any]) -> dict[str, dict[str, float]]:
    """GiB per card each run uses (run id -> {device: GiB}); empty on simulated cards or without NVML."""
    runs = list(runs)
    if inventory.simulated or not runs:
        return {}
    return inventory.process_memory(run_pids(runs))
