"""What each run on this agent uses per card, from NVML's per-process figures (beyond docs/workers.md's
limits: the ledger counts budgets; this shows the actual use beside them). Real NVIDIA cards only:
simulated cards have no such figure and none is made up."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any


def run_pids(runs: Iterable[Any]) -> dict[str, set[int]]:
    """Each running run's processes (every member of its launcher group: a ddp run's ranks) and their
    descendants: whose NVML figures count."""
    import psutil

    out: dict[str, set[int]] = {}
    for rs in list(runs):
        group = getattr(rs, "group", None)
        # a ComfyUI run's work happens in its instance, a process of the agent's, not of the run's group
        members = list(getattr(group, "pids", None) or []) + list(getattr(rs, "extra_pids", None) or [])
        if rs.finished or not members:
            continue
        pids: set[int] = set()
        for pid in members:
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(pid)
                if proc.status() == psutil.STATUS_ZOMBIE:
                    continue
                pids.add(pid)
                pids |= {c.pid for c in proc.children(recursive=True)}
        if pids:
            out[rs.run_id] = pids
    return out


def run_memory(inventory: Any, runs: Iterable[Any]) -> dict[str, dict[str, float]]:
    """GiB per card each run uses (run id -> {device: GiB}); empty on simulated cards or without NVML."""
    runs = list(runs)
    if inventory.simulated or not runs:
        return {}
    return inventory.process_memory(run_pids(runs))
