"""A run's memory on its cards (docs/workers.md, docs/memory.md): the allocator cap to its budget, and what it used.

* Real CUDA cards: the allocator is capped to the budget before any node runs
  (``torch.cuda.set_per_process_memory_fraction``), so a run over its budget runs out of memory alone; the
  figure reported is the allocator's high-water mark per card (``devices``; ``reserved``: the caching
  allocator's, blocks included).
* MPS: there is no peak counter; the figure is what the driver holds at the end of the run
  (``torch.mps.driver_allocated_memory``, caches included), labelled so.
* Simulated cards (docs/architecture.md): the run executes on the CPU, so there is no allocator to cap and no CUDA
  figure. :func:`simulated_card_memory` counts the tensor storage the run process holds (a
  ``TorchDispatchMode``: every storage an op creates, from the op until its last tensor is gone) and, with
  a budget, fails the run with an out-of-memory error when that count goes over the budget: a simulated
  cap, so a test can show a run exceeding its budget. Its figure is labelled simulated, never CUDA.
"""

from __future__ import annotations

import sys
from typing import Any

from ...constants import BYTES_PER_GB

GIB = BYTES_PER_GB  # one definition of a GiB: constants.py
SIMULATED_LABEL = "simulated card: the most tensor storage the run held on the CPU (not a CUDA figure)"
MPS_LABEL = "memory the MPS driver held at the end of the run (caches included; MPS has no peak counter)"


def peak_memory(simulated: Any = None, devices: list[str] | None = None) -> dict[str, Any]:
    """What this process used per card: the CUDA allocator's high-water mark, MPS driver-held memory at the
    end, or (``simulated``: a :func:`simulated_card_memory`) a simulated card's tensor bytes, each labelled;
    ``measured: false`` with the reason when nothing was measured on a card."""
    if simulated is not None:
        cards = [d for d in (devices or ["cuda:0"]) if d.startswith("cuda")] or ["cuda:0"]
        return {"measured": False, "simulated": True, "unit": "GiB", "kind": "simulated_tensor_bytes",
                "label": SIMULATED_LABEL, "devices": {d: round(simulated.peak / GIB, 6) for d in cards}}
    torch = sys.modules.get("torch")
    if torch is None:
        return {"measured": False, "reason": "the run did not use torch"}
    try:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            cards, reserved = {}, {}
            for i in range(torch.cuda.device_count()):
                peak = torch.cuda.max_memory_allocated(i)
                if peak:
                    cards[f"cuda:{i}"] = round(peak / GIB, 4)
                    reserved[f"cuda:{i}"] = round(torch.cuda.max_memory_reserved(i) / GIB, 4)
            # "reserved": the caching allocator's high-water mark (what the card gave the process, blocks
            # included); docs/gpu-check.md compares it with the static estimate and NVML's figure.
            return {"measured": True, "unit": "GiB", "kind": "cuda_max_memory_allocated", "devices": cards,
                    "reserved": reserved}
        mps = getattr(torch, "mps", None)
        if mps is not None and torch.backends.mps.is_available():
            held = mps.driver_allocated_memory()
            if held:
                return {"measured": True, "unit": "GiB", "kind": "mps_driver_allocated", "label": MPS_LABEL,
                        "devices": {"mps:0": round(held / GIB, 4)}}
        return {"measured": False, "reason": "the run used no CUDA device (no peak counter on cpu/xpu; MPS held "
                                             "no memory)"}
    except Exception as exc:  # noqa: BLE001 - a broken CUDA state must not hide the run's result
        return {"measured": False, "reason": f"could not read the CUDA peak: {exc}"}


def simulated_oom_text(device: str, live: int, budget_gib: float) -> str:
    return (f"simulated out of memory on {device}: the run's tensors reached {live / GIB:.3f} GiB, over its "
            f"budget of {budget_gib:.3f} GiB (simulated card: the cap counts tensor storage on the CPU)")


def simulated_card_memory(budget_gib: float | None = None, device: str = "cuda:0") -> Any:
    """A ``TorchDispatchMode`` (enter it around the run) counting the run's tensor bytes on a simulated
    card; with ``budget_gib`` it raises ``torch.OutOfMemoryError`` when they go over (see the module doc).
    Imports torch: call it only in the run process."""
    import torch

    from ...predictor.meta_sim import LiveBytes

    cap = None if budget_gib is None else int(float(budget_gib) * GIB)

    from torch.utils._python_dispatch import _get_current_dispatch_mode

    class _Capped(LiveBytes):
        budget = budget_gib
        card = device
        paused = False

        def track(self, tensor: Any) -> None:
            super().track(tensor)
            if cap is not None and self.live > cap:
                raise torch.OutOfMemoryError(simulated_oom_text(device, self.live, float(budget_gib or 0)))

        def pause(self) -> bool:
            """Step off the dispatch stack (only when innermost: another mode above stays intact); the
            storages already counted stay counted and still leave the count when they are freed."""
            if self.paused or _get_current_dispatch_mode() is not self:
                return self.paused
            super().__exit__(None, None, None)
            self.paused = True
            return True

        def resume(self, live: Any) -> None:
            """Back on the stack; count ``live`` (what outlived the paused ops) once more."""
            if not self.paused:
                return
            super().__enter__()
            self.paused = False
            self.track_all(t for t in live if isinstance(t, torch.Tensor))

        def __exit__(self, *exc: Any) -> Any:
            if self.paused:  # a loop that failed while paused: the mode is off the stack already
                self.paused = False
                return None
            return super().__exit__(*exc)

    return _Capped()


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocator failure (CUDA, the simulated cap): ``torch.OutOfMemoryError`` or CUDA's older text."""
    return type(exc).__name__ == "OutOfMemoryError" or "CUDA out of memory" in str(exc)


def memory_fractions(budget_gib: float, totals_bytes: list[int]) -> list[float]:
    """The allocator cap per card for a budget of ``budget_gib`` per card (docs/workers.md, docs/memory.md): the fraction
    of each card's total that the budget is, at most 1."""
    if budget_gib <= 0:
        raise ValueError(f"budget_gib must be > 0, got {budget_gib}")
    return [min(1.0, budget_gib * GIB / total) if total > 0 else 1.0 for total in totals_bytes]


def rank_fractions(fractions: list[float], rank: int) -> list[float]:
    """A ddp rank's caps (docs/ddp.md, docs/memory.md): its own card (``rank``) keeps its budget, every other card of the
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
