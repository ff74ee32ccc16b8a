"""Which budget a run gets (docs/workers.md, "sharing a card"): typed, measured peak + 20%, estimate, raises."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpufleet.predictor.estimate import estimate_graph
from xpufleet.server.ledger import budget as B
from xpufleet.server.ledger.budget import Budget, BudgetError, DefaultBudget, MeasuredPeak

EXAMPLES = Path(__file__).resolve().parents[3] / "samples"
RUN1, RUN2 = "a1b2c3d4-0000-4000-8000-000000000001", "c3d4e5f6-0000-4000-8000-000000000002"


def peak(gib: float, run: str = RUN1, *, key: str = "g1-k", cards: int = 1, source: str = "cuda",
         ok: bool = True) -> MeasuredPeak:
    return MeasuredPeak(key, cards, gib, run, source, ok)


# --- the default budget ----------------------------------------------------------------------------------


def test_default_is_the_measured_peak_plus_20_percent_with_its_run():
    d = B.default_budget([peak(5.0)], "g1-k", 1)
    assert d == DefaultBudget(6.0, 5.0, RUN1, 1)


def test_default_comes_from_the_same_key_on_the_same_number_of_cards():
    peaks = [peak(5.0), peak(9.0, RUN2, cards=2), peak(20.0, key="g1-other")]
    assert B.default_budget(peaks, "g1-k", 1).peak_gib == 5.0
    assert B.default_budget(peaks, "g1-k", 2) == DefaultBudget(10.8, 9.0, RUN2, 2)
    assert B.default_budget(peaks, "g1-k", 4) is None


def test_default_takes_the_largest_peak_of_successful_cuda_runs():
    peaks = [peak(5.0), peak(7.0, RUN2), peak(30.0, "failed-run", ok=False), peak(40.0, "mps-run", source="mps"),
             peak(50.0, "sim-run", source="simulated")]
    assert B.default_budget(peaks, "g1-k", 1) == DefaultBudget(8.4, 7.0, RUN2, 1)
    assert B.default_budget(peaks[-2:], "g1-k", 1) is None  # MPS holds memory, it has no peak; simulated: none


def test_headroom_is_rounded_up_to_a_hundredth():
    assert B.with_headroom(1.0) == 1.2
    assert B.with_headroom(0.1234) == 0.15
    assert B.with_headroom(10.0) == 12.0


# --- at submit time --------------------------------------------------------------------------------------


def test_a_typed_budget_is_never_changed():
    default = DefaultBudget(12.0, 10.0, RUN1, 1)
    assert B.resolve_budget(4.0, None, default, n_cards=1, shared_only=True) == Budget(4.0, "user")
    assert B.resolve_budget(4.0, "user", default, n_cards=1, shared_only=True) == Budget(4.0, "user")
    assert B.raise_waiting(Budget(4.0, "user"), default, lambda gib: True) is None


def test_no_budget_gets_the_default():
    default = DefaultBudget(6.0, 5.0, RUN1, 1)
    got = B.resolve_budget(None, None, default, n_cards=1, shared_only=True)
    assert got == Budget(6.0, "measured", RUN1, 5.0)
    assert got.label() == "6.0 GiB (peak of run a1b2c3d4 + 20%)"


def test_an_unmodified_measured_suggestion_means_the_servers_default():
    default = DefaultBudget(6.0, 5.0, RUN1, 1)
    assert B.resolve_budget(6.0, "measured", default, n_cards=1, shared_only=True) == Budget(6.0, "measured", RUN1, 5.0)
    with pytest.raises(BudgetError, match="no measured peak on 2 cards: send memory_gib without memory_source"):
        B.resolve_budget(6.0, "measured", None, n_cards=2, shared_only=True)


def test_no_peak_and_no_budget_on_shared_cards_is_rejected_asking_for_one():
    with pytest.raises(BudgetError) as err:
        B.resolve_budget(None, None, None, n_cards=1, shared_only=True)
    assert str(err.value) == ("this graph has no measured peak on 1 card and the run declares no budget: set "
                              "options.target.memory_gib (GiB per card) to queue it on a card shared by memory")
    # with exclusive cards among its candidates it runs there without a budget
    assert B.resolve_budget(None, None, None, n_cards=1, shared_only=False) is None


def test_an_estimate_is_sent_as_the_declared_budget_marked_estimate():
    got = B.resolve_budget(3.2, "estimate", None, n_cards=1, shared_only=True)
    assert got == Budget(3.2, "estimate")
    assert got.label() == "3.2 GiB (est.)"
    smaller = DefaultBudget(2.4, 2.0, RUN1, 1)
    assert B.resolve_budget(3.2, "estimate", smaller, n_cards=1, shared_only=True) == Budget(3.2, "estimate")


def test_an_estimate_is_raised_to_a_larger_measured_default_at_submit():
    default = DefaultBudget(7.44, 6.2, RUN1, 1)
    got = B.resolve_budget(3.2, "estimate", default, n_cards=1, shared_only=True)
    assert (got.gib, got.source, got.from_run, got.declared_gib) == (7.44, "measured", RUN1, 3.2)
    assert got.reason == ("raised from the estimate 3.2 GiB to 7.4 GiB: run a1b2c3d4 of the same graph on 1 card "
                          "peaked at 6.2 GiB (+20%)")
    assert got.to_json()["budget_reason"] == got.reason


def test_bad_memory_source_and_source_without_budget():
    with pytest.raises(BudgetError, match="one of user, measured, estimate"):
        B.resolve_budget(1.0, "guess", None, n_cards=1, shared_only=False)
    with pytest.raises(BudgetError, match="needs options.target.memory_gib"):
        B.resolve_budget(None, "estimate", None, n_cards=1, shared_only=False)


# --- while the run waits ----------------------------------------------------------------------------------


def test_a_waiting_estimate_is_raised_when_a_larger_peak_arrives():
    raised = B.raise_waiting(Budget(3.2, "estimate"), DefaultBudget(7.44, 6.2, RUN2, 1), lambda gib: True)
    assert raised.fail is None
    assert (raised.budget.gib, raised.budget.source, raised.budget.from_run) == (7.44, "measured", RUN2)
    assert raised.budget.reason == ("raised from the estimate 3.2 GiB to 7.4 GiB: while the run waited, run "
                                    "c3d4e5f6 of the same graph on 1 card peaked at 6.2 GiB (+20%)")


def test_a_waiting_measured_budget_is_raised_and_never_lowered():
    current = Budget(6.0, "measured", RUN1, 5.0)
    assert B.raise_waiting(current, DefaultBudget(6.0, 5.0, RUN1, 1), lambda gib: True) is None
    assert B.raise_waiting(current, DefaultBudget(4.8, 4.0, RUN2, 1), lambda gib: True) is None
    raised = B.raise_waiting(current, DefaultBudget(9.6, 8.0, RUN2, 1), lambda gib: True)
    assert raised.budget.gib == 9.6 and raised.budget.reason.startswith("raised from 6.0 GiB to 9.6 GiB: while the")
    assert B.raise_waiting(None, DefaultBudget(9.6, 8.0, RUN2, 1), lambda gib: True) is None


def test_a_raise_beyond_every_usable_card_fails_the_run():
    asked: list[float] = []

    def fits(gib: float) -> bool:
        asked.append(gib)
        return gib <= 24

    raised = B.raise_waiting(Budget(3.2, "estimate"), DefaultBudget(30.0, 25.0, RUN2, 1), fits)
    assert asked == [30.0]
    assert raised.fail == ("raised from the estimate 3.2 GiB to 30.0 GiB: while the run waited, run c3d4e5f6 of "
                           "the same graph on 1 card peaked at 25.0 GiB (+20%), more than any card this run may use has")


def test_a_run_queued_while_exclusive_gets_the_default_when_the_card_turns_shared():
    assert B.fill_default(None, None) is None  # it keeps waiting
    assert B.fill_default(None, DefaultBudget(6.0, 5.0, RUN1, 1)) == Budget(6.0, "measured", RUN1, 5.0)
    typed = Budget(2.0, "user")
    assert B.fill_default(typed, DefaultBudget(6.0, 5.0, RUN1, 1)) is typed


# --- texts --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("budget", "words"), [
    (Budget(4.0, "user"), "(the budget you typed)"),
    (Budget(6.0, "measured", RUN1, 5.0), "(the measured peak of run a1b2c3d4 + 20%)"),
    (Budget(3.2, "estimate"), "(the static estimate)"),
])
def test_out_of_memory_under_a_budget_names_its_source(budget, words):
    msg = B.oom_message(budget, "cuda:1")
    assert msg.startswith(f"out of memory on cuda:1 under its budget of {budget.gib:.1f} GiB {words}")
    assert msg.endswith("declare a larger options.target.memory_gib")


def test_budget_labels():
    assert Budget(6.0, "user").label() == "6.0 GiB"


# --- the dialog's suggestion --------------------------------------------------------------------------------


def test_measured_suggestion_never_builds_the_estimate():
    def estimate(graph):  # noqa: ARG001
        raise AssertionError("the estimate must not be built when a measured peak exists")

    s = B.suggest({}, DefaultBudget(6.0, 5.0, RUN1, 1), estimate=estimate)
    assert (s.source, s.budget_gib, s.from_run) == ("measured", 6.0, RUN1)
    assert sum(i["gib"] for i in s.items) == pytest.approx(s.total_gib)


def test_estimate_suggestion_from_an_example():
    s = B.suggest(json.loads((EXAMPLES / "mlp_digits.json").read_text()), None, estimate=estimate_graph)
    assert s.source == "estimate" and not s.rough
    assert s.budget_gib == s.total_gib and s.total_gib > 72 / 1024  # at least the CUDA libraries' 72 MiB
    assert [i["name"] for i in s.items] == ["weights", "training", "activations", "allocator", "cuda_libraries"]
    assert s.to_json()["items"][0]["label"] == "6,570 parameters x 4 B (node 8)"  # the trained copy only


def test_rough_estimate_leaves_the_field_empty():
    g = json.loads((EXAMPLES / "predict_saved.json").read_text())  # a model loaded from a file
    s = B.suggest(g, None, estimate=estimate_graph)
    assert s.budget_gib is None and s.rough and "XPUModelLoader" in s.reasons[0]
