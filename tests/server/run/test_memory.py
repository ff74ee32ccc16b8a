"""The run child caps the CUDA allocator to the run's budget (SPEC W2) and says when it cannot."""

from __future__ import annotations

import pytest

from xpufleet.server.run.memory import GIB, apply_memory_budget, memory_fractions


def test_fraction_is_budget_over_total_capped_at_one():
    assert memory_fractions(6, [24 * GIB, 12 * GIB]) == [0.25, 0.5]
    assert memory_fractions(30, [24 * GIB]) == [1.0]
    with pytest.raises(ValueError, match="budget_gib must be > 0"):
        memory_fractions(0, [24 * GIB])


def test_no_budget_or_no_cuda_card_changes_nothing():
    facts: dict = {}
    apply_memory_budget({"devices": ["cuda:0"]}, facts)
    apply_memory_budget({"devices": ["cpu"], "budget_gib": 4}, facts)
    assert facts == {}


def test_simulated_cards_are_not_pretended_capped():
    facts: dict = {}
    apply_memory_budget({"devices": ["cuda:0", "cuda:1"], "budget_gib": 6, "simulated": True}, facts)
    assert facts["memory_cap"]["applied"] is False and "simulated" in facts["memory_cap"]["reason"]


def test_without_cuda_the_reason_is_recorded():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the cap is applied for real there")
    facts: dict = {}
    apply_memory_budget({"devices": ["cuda:0"], "budget_gib": 6}, facts)
    assert facts["memory_cap"] == {"applied": False, "budget_gib": 6, "reason": "CUDA is not available"}


def test_the_cap_is_applied_per_card_before_the_run(monkeypatch):
    """The branch that runs on a real CUDA worker, with a stand-in of torch.cuda (no GPU here): every
    card of the run gets set_per_process_memory_fraction(budget / its total) before any node runs."""
    import torch

    calls: list[tuple[float, int]] = []
    totals = [24 * GIB, 80 * GIB, 8 * GIB]

    class Props:
        def __init__(self, i: int) -> None:
            self.total_memory = totals[i]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props(i))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((f, i)))
    facts: dict = {}
    apply_memory_budget({"devices": ["cuda:0", "cuda:1", "cpu"], "budget_gib": 12}, facts)
    assert calls == [(0.5, 0), (0.15, 1)]  # the run's two cards, not the third the process could see
    assert facts["memory_cap"] == {"applied": True, "budget_gib": 12,
                                   "fractions": {"cuda:0": 0.5, "cuda:1": 0.15}}
