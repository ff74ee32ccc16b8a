"""What a finished run says about memory, and what running runs use (parts of :class:`~.admission.MemoryAdmission`).

* the error of a run that ran out of memory under its budget names the budget's source and asks for a
  larger ``target.memory_gib``;
* every finished run's per-card figure is recorded under its runtime-graph key and number of cards;
* (a successful run with a larger peak raises the budgets of the same graph's waiting runs:
  :meth:`~.admission.MemoryAdmission.peak_recorded`, which owns the waiting runs);
* NVML per-process figures of running runs (an agent's heartbeat) are kept beside their budgets.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..ledger.budget import Budget, oom_message
from .records import RunMemory


class RunUsage:
    """NVML per-process figures of running runs (an agent's heartbeat), kept beside their budgets; the largest
    persisted through ``set_facts(run_id, facts)`` (the store's ``set_execution_facts``)."""

    def __init__(self, set_facts: Callable[[str, dict[str, Any]], Any]) -> None:
        self._set_facts = set_facts
        self.by_run: dict[str, dict[str, Any]] = {}  # run id -> its figures

    def get(self, run_id: str) -> dict[str, Any] | None:
        return self.by_run.get(run_id)

    def forget(self, run_id: str) -> None:
        self.by_run.pop(run_id, None)

    def record(self, worker: str, runs: Sequence[Mapping[str, Any]]) -> None:
        """Per-run memory from NVML per-process figures (an agent's heartbeat): kept, the largest persisted."""
        now = time.time()
        for r in runs:
            mem = r.get("memory")
            if not isinstance(mem, Mapping) or not mem:
                continue
            run_id = str(r["run_id"])
            devices = {str(k): round(float(v), 3) for k, v in mem.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            entry = self.by_run.setdefault(run_id, {"source": "NVML per-process used memory", "devices": {}, "max": {}})
            entry["devices"] = devices
            entry["at"] = now
            entry["worker"] = worker  # a spread run's cards on another worker are not these
            grew = False
            for dev, gib in devices.items():
                if gib > entry["max"].get(dev, -1.0):
                    entry["max"][dev] = gib
                    grew = True
            if grew:
                self._set_facts(run_id, {"memory_in_use": {
                    "source": entry["source"], "unit": "GiB", "devices": devices, "max": dict(entry["max"]),
                    "worker": worker}})


def oom_payload(payload: dict[str, Any], info: RunMemory | None,
                run_of: Callable[[], Mapping[str, Any] | None]) -> dict[str, Any]:
    """Before a run's ``run_finished`` is stored: an out-of-memory failure under a budget says where the
    budget came from and asks for a larger ``target.memory_gib`` (``run_of()``: the run's record, read only then)."""
    oom = payload.get("out_of_memory")
    if not isinstance(oom, Mapping) or info is None or info.budget is None or payload.get("status") != "failed" \
            or oom.get("budget_gib") is None:  # the run was not capped (no budget reached its process)
        return payload
    run = run_of() or {}
    device = str(oom.get("device") or (run.get("devices") or ["cuda:0"])[0])
    where = f"{device} on {run['worker_id']}" if run.get("worker_id") else f"{device} on this server"
    budget = info.budget
    if isinstance(oom.get("budget_gib"), (int, float)) and oom["budget_gib"] != budget.gib:
        budget = Budget(float(oom["budget_gib"]), budget.source, budget.from_run, budget.peak_gib,
                        budget.declared_gib, budget.reason, budget.peak_source)
    text = oom_message(budget, where)
    if oom.get("simulated"):
        text += " (simulated card: the run's tensors on the CPU went over the budget)"
    detail = payload.get("error")
    return {**payload, "error": f"{text}. {detail}" if detail else text}
