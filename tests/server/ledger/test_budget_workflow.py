"""A ComfyUI workflow's budget on a shared card (docs/memory.md): the measured default first, else the
injected static estimate (seed 001's M_peak), marked ``estimate``; no figure: a typed budget is asked for."""

from __future__ import annotations

import pytest

from xpufleet.server.ledger import budget as B
from xpufleet.server.ledger.budget import Budget, BudgetError, DefaultBudget


def test_the_estimate_is_the_budget_on_shared_cards_without_a_measured_peak() -> None:
    asked = []

    def est() -> float:
        asked.append(1)
        return 2.5

    assert B.resolve_budget(None, None, None, n_cards=1, shared_only=True, estimate_gib=est) == Budget(2.5, "estimate")
    assert B.resolve_budget(None, None, None, n_cards=1, shared_only=False, estimate_gib=est) is None
    assert len(asked) == 1  # an exclusive card never builds it


def test_a_measured_default_comes_before_the_estimate_and_a_typed_budget_before_both() -> None:
    default = DefaultBudget(budget_gib=3.6, peak_gib=3.0, run_id="r" * 32, n_cards=1, source="cuda")
    got = B.resolve_budget(None, None, default, n_cards=1, shared_only=True, estimate_gib=lambda: 9.0)
    assert got is not None and got.source == "measured" and got.gib == 3.6
    assert B.resolve_budget(1.0, None, None, n_cards=1, shared_only=True, estimate_gib=lambda: 9.0) == Budget(1.0, "user")


def test_no_estimate_asks_for_a_budget() -> None:
    with pytest.raises(BudgetError, match="set options.target.memory_gib"):
        B.resolve_budget(None, None, None, n_cards=1, shared_only=True, estimate_gib=lambda: None)
