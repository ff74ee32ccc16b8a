"""The memory fields of the Runs and Workers data (``GET /api/runs``, ``GET /api/workers``).

A run shows its budget (value, source, the run whose peak it came from, the declared value and the reason
of a raise, the label of the Runs panel's budget column), its runtime-graph key and number of cards, and
once it ended its per-card figure with what measured it. A card shared by memory shows what the Workers
panel draws: in use (the heartbeat's total - free), reserved, running, free for a new budget once the CUDA
context is taken off, the runs on it (with their budgets, and what NVML says they use on real cards), and
a hold for an overtaken run.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..ledger.fit import short_id
from .admission import MemoryAdmission
from .peaks import LABELS
from .records import RunMemory


def budget_view(info: RunMemory | None) -> dict[str, Any] | None:
    if info is None or info.budget is None:
        return None
    b = info.budget
    return {"gib": b.gib, "source": b.source, "from_run": b.from_run, "peak_gib": b.peak_gib,
            "peak_source": b.peak_source or ("cuda" if b.from_run else None), "declared_gib": b.declared_gib,
            "reason": b.reason, "label": b.label()}


def run_fields(adm: MemoryAdmission, runs: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """run id -> the memory fields of that run (two queries for the whole page)."""
    runs = list(runs)
    ids = [r["id"] for r in runs]
    infos = adm.records.runs(ids)
    peaks = adm.records.peaks_of(ids)
    out = {}
    for run_id in ids:
        info = infos.get(run_id)
        peak = peaks.get(run_id)
        if peak is not None and peak.get("source"):
            peak = {**peak, "label": LABELS.get(peak["source"], peak["source"])}
        out[run_id] = {"budget": budget_view(info), "graph_key": info.graph_key if info else None,
                       "n_cards": info.n_cards if info else None, "memory_peak": peak}
    return out


def card_view(adm: MemoryAdmission, provider: str, device: str) -> dict[str, Any] | None:
    """A card's memory as the Workers panel draws it (None: the card admits by slot, not by memory)."""
    state = adm.slot_state()
    key = state.index.get((provider, device))
    if key is None or key not in adm.keys:
        slot = state.slots.get(key) if key is not None else None
        if slot is None or adm.mode_at(provider, device) != "shared":
            return None
        others = [o.provider for o in slot.offers if o.provider != provider
                  and adm.mode_at(o.provider, o.device) != "shared"]
        return {"admits_by_memory": False,
                "note": (f"shared here, but the same card is exclusive on {', '.join(others) or 'another provider'}: "
                         f"it admits runs by slot until every provider offering it shares it")}
    view = adm.ledger.card_view(key)
    if view is None:
        return None
    for r in view["runs"]:
        usage = adm.usage.get(r["id"])
        if usage is not None and usage.get("worker", provider) == provider:
            r["in_use_gib"] = usage["devices"].get(device)
            r["in_use_source"] = usage["source"]
        info = adm.info.get(r["id"])
        if info is not None and info.budget is not None:
            r["budget_label"] = info.budget.label()
    holder = adm.holds.holder(key)
    view.update({"admits_by_memory": True, "key": key, "simulated": key in adm.simulated,
                 "held_for": None if holder is None else {
                     "run": holder, "overtaken": adm.holds.overtaken.get((holder, key), 0),
                     "text": f"held for run {short_id(holder)}: later runs do not start here until it starts"}})
    return view
