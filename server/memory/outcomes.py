"""What a finished run changes for memory budgets (a mixin of :class:`~.admission.MemoryAdmission`).

* the error of a run that ran out of memory under its budget names the budget's source and asks for a
  larger ``target.memory_gib``;
* every finished run's per-card figure is recorded under its runtime-graph key and number of cards;
* a successful run with a larger peak raises the budgets of the same graph's waiting runs (an estimate,
  or a default) with the reason, fails a run whose raised budget no usable card could hold, never changes
  a typed budget, and gives the default to a run that waited without one;
* NVML per-process figures of running runs (an agent's heartbeat) are kept beside their budgets.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from ..ledger.budget import Budget, fill_default, oom_message, raise_waiting
from ..ledger.fit import short_id
from .peaks import CardPeak, card_peak


class RunOutcomes:
    """Finished runs and per-run use (mixed into :class:`~.admission.MemoryAdmission`)."""

    def run_usage(self, worker: str, runs: Sequence[Mapping[str, Any]]) -> None:
        """Per-run memory from NVML per-process figures (an agent's heartbeat): kept, the largest persisted."""
        now = time.time()
        for r in runs:
            mem = r.get("memory")
            if not isinstance(mem, Mapping) or not mem:
                continue
            run_id = str(r["run_id"])
            devices = {str(k): round(float(v), 3) for k, v in mem.items()
                       if isinstance(v, (int, float)) and not isinstance(v, bool)}
            entry = self.usage.setdefault(run_id, {"source": "NVML per-process used memory", "devices": {}, "max": {}})
            entry["devices"] = devices
            entry["at"] = now
            entry["worker"] = worker  # a spread run's cards on another worker are not these
            grew = False
            for dev, gib in devices.items():
                if gib > entry["max"].get(dev, -1.0):
                    entry["max"][dev] = gib
                    grew = True
            if grew:
                self.d.store.set_execution_facts(run_id, {"memory_in_use": {
                    "source": entry["source"], "unit": "GiB", "devices": devices, "max": dict(entry["max"]),
                    "worker": worker}})

    # --- finished runs, measured peaks and raises -----------------------------------------------------

    def finishing(self, run_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Before a run's ``run_finished`` is stored: an out-of-memory failure under a budget says where the
        budget came from and asks for a larger ``target.memory_gib``."""
        oom = payload.get("out_of_memory")
        info = self.info.get(run_id) or self.records.run(run_id)
        if not isinstance(oom, Mapping) or info is None or info.budget is None or payload.get("status") != "failed" \
                or oom.get("budget_gib") is None:  # the run was not capped (no budget reached its process)
            return payload
        run = self.d.store.get_run(run_id) or {}
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

    def finished(self, run_id: str, status: str, peak_memory: Any) -> None:
        """A run ended: its per-card figure is recorded under its graph key and number of cards; a larger
        peak of a successful run raises the budgets of the same graph's waiting runs."""
        info = self.info.get(run_id) or self.records.run(run_id)
        if info is None:
            return
        peak = card_peak(peak_memory)
        self.records.record_peak(run_id, info.graph_key, info.n_cards, status, peak)
        if status == "succeeded" and peak is not None and info.graph_key is not None:
            self.peak_recorded(info.graph_key, info.n_cards, run_id, peak)

    def peak_recorded(self, graph_key: str, n_cards: int, run_id: str, peak: CardPeak) -> None:
        """Raise (or give) the budgets of the waiting runs of this graph on this many cards."""
        for other in sorted(self.by_graph.get((graph_key, n_cards), set())):
            w = self.waiting.get(other)
            info = self.info.get(other)
            if w is None or info is None or other == run_id:
                continue
            default = self.default_for(graph_key, n_cards, w.all_keys)
            if default is None:
                continue
            if info.budget is None:
                budget = fill_default(None, default)
                if budget is not None:
                    self._set_budget(other, info, Budget(
                        budget.gib, budget.source, budget.from_run, budget.peak_gib, None,
                        f"given the graph's default budget: run {short_id(run_id)} of the same graph succeeded",
                        budget.peak_source))
                    self._requeue(other)
                continue

            def fits_somewhere(gib: float, w: Any = w) -> bool:
                if w.has_slot:
                    return True
                return any(self.ledger.fits_ever(keys, gib) is not False for keys in w.all_keys)

            raised = raise_waiting(info.budget, default, fits_somewhere)
            if raised is None:
                continue
            if raised.fail is not None:
                self._set_budget(other, info, raised.budget)
                self.d.run_ended(other, "failed", raised.fail)
                continue
            self._set_budget(other, info, raised.budget)
            if other in self.queue:
                self.queue.set_budget(other, raised.budget.gib)
            for keys in w.all_keys:
                self._dirty.update(keys)
        self.d.wake()

    def _requeue(self, run_id: str) -> None:
        """A waiting run's candidates depend on its budget (agents that cannot cap): queue it again in its
        place (the queue is rebuilt in submission order)."""
        self._serial = None
        self._rebuild_queue(self.d.slot_state(), self.d.queued_candidates())
