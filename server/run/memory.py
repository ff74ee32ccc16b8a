"""A run's memory on its cards: the allocator cap to its budget (SPEC W2, M) and the measured peak."""

from __future__ import annotations

import sys
from typing import Any

from ...constants import BYTES_PER_GB

GIB = BYTES_PER_GB  # one definition of a GiB: constants.py


def peak_memory() -> dict[str, Any]:
    """CUDA allocator high-water mark per card of this process; ``measured: false`` without CUDA."""
    torch = sys.modules.get("torch")
    if torch is None:
        return {"measured": False, "reason": "the run did not use torch"}
    try:
        if not torch.cuda.is_available() or not torch.cuda.is_initialized():
            return {"measured": False, "reason": "the run used no CUDA device (no peak counter on cpu/mps/xpu)"}
        cards = {}
        for i in range(torch.cuda.device_count()):
            peak = torch.cuda.max_memory_allocated(i)
            if peak:
                cards[f"cuda:{i}"] = round(peak / GIB, 4)
        return {"measured": True, "unit": "GiB", "kind": "cuda_max_memory_allocated", "devices": cards}
    except Exception as exc:  # noqa: BLE001 - a broken CUDA state must not hide the run's result
        return {"measured": False, "reason": f"could not read the CUDA peak: {exc}"}


def memory_fractions(budget_gib: float, totals_bytes: list[int]) -> list[float]:
    """The allocator cap per card for a budget of ``budget_gib`` per card (SPEC W2, M): the fraction
    of each card's total that the budget is, at most 1."""
    if budget_gib <= 0:
        raise ValueError(f"budget_gib must be > 0, got {budget_gib}")
    return [min(1.0, budget_gib * GIB / total) if total > 0 else 1.0 for total in totals_bytes]


def rank_fractions(fractions: list[float], rank: int) -> list[float]:
    """A ddp rank's caps (SPEC §4, M): its own card (``rank``) keeps its budget, every other card of the
    set gets 0, so a node pinned to another rank's card fails at its first allocation instead of using
    memory beyond that card's budget."""
    return [f if i == rank else 0.0 for i, f in enumerate(fractions)]


def apply_memory_budget(spec: dict[str, Any], facts: dict[str, Any], role: Any = None) -> None:
    """Cap the CUDA allocator to the run's budget before any node runs, so a run over its budget
    runs out of memory alone (``torch.cuda.set_per_process_memory_fraction``). A ddp rank (``role``)
    is capped to its own card (:func:`rank_fractions`). Simulated cards have no allocator to cap: the
    fact says so instead of pretending."""
    budget = spec.get("budget_gib")
    if budget is None:
        return
    devices = [d for d in (spec.get("devices") or []) if d.startswith("cuda")]
    if not devices:
        return
    if spec.get("simulated"):
        facts["memory_cap"] = {"applied": False, "budget_gib": budget,
                               "reason": "simulated cards: the run executes on the CPU"}
        return
    import torch

    if not torch.cuda.is_available():
        facts["memory_cap"] = {"applied": False, "budget_gib": budget, "reason": "CUDA is not available"}
        return
    indices = list(range(min(len(devices), torch.cuda.device_count())))
    totals = [torch.cuda.get_device_properties(i).total_memory for i in indices]
    fractions = memory_fractions(float(budget), totals)
    if role is not None:
        fractions = rank_fractions(fractions, role.rank)
    for i, fraction in zip(indices, fractions, strict=True):
        torch.cuda.set_per_process_memory_fraction(fraction, i)
    facts["memory_cap"] = {"applied": True, "budget_gib": budget,
                           "fractions": {f"cuda:{i}": round(f, 6) for i, f in zip(indices, fractions, strict=True)}}
