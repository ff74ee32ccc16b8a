"""The per-card ledger and the fit rule (docs/workers.md, "sharing a card"): boundaries, every text, decisions."""

from __future__ import annotations

import pytest

from xpufleet.server.ledger import fit as F
from xpufleet.server.ledger.fit import GIB, Ledger, context_mib_from_env
from xpufleet.server.scheduling import (
    Candidate,
    DeviceOffer,
    LimitOverrides,
    ProviderInfo,
    QueuedRun,
    build_state,
    plan,
)

KEY = "uuid:GPU-1"
LABEL = "cuda:1 on gpu-box"
A, B = "a1b2c3d4-0000-4000-8000-000000000001", "c3d4e5f6-0000-4000-8000-000000000002"


def card(total: float | None = 24.0, free: float | None = 24.0, *, kind: str = "cuda", shared: bool = True,
         context_mib: int = 768) -> Ledger:
    ledger = Ledger(context_mib)
    ledger.set_card(KEY, LABEL, kind, shared=shared, total_gib=total, free_gib=free)
    return ledger


def status(ledger: Ledger, budget_gib: float | None, key: str = KEY) -> str:
    return ledger.card_status(key, F.to_bytes(budget_gib) if budget_gib is not None else None)


def text(ledger: Ledger, budget_gib: float | None, key: str = KEY) -> str | None:
    return ledger.card_text(key, F.to_bytes(budget_gib) if budget_gib is not None else None)


# --- the rule at its boundaries ------------------------------------------------------------------------


def test_budget_plus_context_equal_to_room_fits():
    ledger = card(free=6.75)  # 6 GiB + 768 MiB = 6.75 GiB exactly
    assert ledger.room(KEY) == int(6.75 * GIB)
    assert status(ledger, 6.0) == F.FITS
    assert ledger.fits_now([KEY], 6.0)


def test_one_byte_short_does_not_fit():
    ledger = card(free=6.75 - 1 / GIB)
    assert ledger.room(KEY) == int(6.75 * GIB) - 1
    assert status(ledger, 6.0) == F.NOT_NOW
    assert not ledger.fits_now([KEY], 6.0)
    assert ledger.fits_ever([KEY], 6.0) is True


def test_room_is_free_minus_reserved_when_that_is_smaller():
    ledger = card(total=24, free=10)
    ledger.reserve(A, [KEY], 4.0)
    assert ledger.room(KEY) == int((10 - 4.75) * GIB)  # 24 - 4.75 is larger
    assert status(ledger, 4.5) == F.FITS
    assert status(ledger, 4.5 + 1 / GIB) == F.NOT_NOW


def test_room_is_total_minus_reserved_minus_running_when_that_is_smaller():
    ledger = card(total=24, free=20)  # a stale heartbeat: the running run has not reached its peak
    ledger.hold_running(A, [KEY], 8.0)
    ledger.reserve(B, [KEY], 4.0)
    assert ledger.room(KEY) == int((24 - 4.75 - 8.75) * GIB)  # 10.5 < 20 - 4.75
    assert status(ledger, 9.75) == F.FITS
    assert status(ledger, 9.75 + 1 / GIB) == F.NOT_NOW


def test_free_counts_every_process_on_the_card():
    ledger = card(total=24, free=3)  # someone else's job holds 21 GiB; the ledger has no run
    assert status(ledger, 2.25) == F.FITS
    assert text(ledger, 6.0) == "needs 6.0 GiB (+0.8 GiB CUDA context), cuda:1 on gpu-box has 3.0 GiB free"


def test_every_run_counts_budget_plus_context():
    ledger = card()
    ledger.reserve(A, [KEY], 1.0)
    ledger.reserve(B, [KEY], 1.0)
    c = ledger.cards[KEY]
    assert c.reserved_sum == 2 * int(1.75 * GIB)
    ledger.start(A)
    assert (c.reserved_sum, c.running_sum) == (int(1.75 * GIB), int(1.75 * GIB))


def test_the_context_is_the_configured_one():
    assert card(context_mib=0).needs_text(card().cards[KEY], F.to_bytes(6)) == "needs 6.0 GiB"
    ledger = card(free=7.0, context_mib=1024)
    assert status(ledger, 6.0) == F.FITS
    assert status(ledger, 6.0 + 1 / GIB) == F.NOT_NOW


def test_no_context_off_cuda():
    ledger = card(total=16, free=6, kind="mps")  # an MPS card that reports a total (a simulated one)
    assert status(ledger, 6.0) == F.FITS
    assert text(ledger, 7.0) == "needs 7.0 GiB, cuda:1 on gpu-box has 6.0 GiB free"


def test_start_moves_the_budget_and_may_grow_the_room():
    ledger = card(total=24, free=24)
    ledger.reserve(A, [KEY], 10.0)
    ledger.pop_grown()
    ledger.start(A)
    assert KEY in ledger.pop_grown()  # free - reserved grew until the next heartbeat shows the run's use
    assert ledger.room(KEY) == int((24 - 10.75) * GIB)


def test_release_frees_what_the_run_counted():
    ledger = card()
    ledger.hold_running(A, [KEY], 10.0)
    ledger.reserve(B, [KEY], 5.0)
    ledger.pop_grown()
    ledger.release(A)
    ledger.release(B)
    ledger.release("never-counted")
    c = ledger.cards[KEY]
    assert (c.reserved_sum, c.running_sum, c.runs()) == (0, 0, [])
    assert ledger.pop_grown() == {KEY}


def test_a_run_is_counted_once():
    ledger = card()
    ledger.reserve(A, [KEY], 1.0)
    with pytest.raises(ValueError, match="already"):
        ledger.hold_running(A, [KEY], 1.0)


def test_heartbeat_that_shows_more_free_memory_marks_the_card():
    ledger = card(free=4)
    ledger.pop_grown()
    ledger.report(KEY, 24, 3)
    assert ledger.pop_grown() == set()
    ledger.report(KEY, 24, 8)
    assert ledger.pop_grown() == {KEY}


# --- the texts -----------------------------------------------------------------------------------------


def test_seed_rejection_text_without_context():
    ledger = card(total=24, free=6.3, context_mib=0)
    ledger.hold_running(A, [KEY], 4.0)
    ledger.hold_running(B, [KEY], 4.0)
    assert text(ledger, 12.0) == "needs 12.0 GiB, cuda:1 on gpu-box has 6.3 GiB free (runs a1b2c3d4, c3d4e5f6)"


def test_seed_rejection_text_with_cuda_context():
    ledger = card(total=24, free=2.8)
    ledger.hold_running(A, [KEY], 4.0)
    ledger.reserve(B, [KEY], 0.05)  # 0.8 GiB counted with its context
    assert text(ledger, 6.0) == ("needs 6.0 GiB (+0.8 GiB CUDA context), cuda:1 on gpu-box has 2.0 GiB free "
                                 "(runs a1b2c3d4, c3d4e5f6)")


def test_free_figure_is_rounded_down_and_never_negative():
    ledger = card(total=24, free=6.79)
    assert text(ledger, 6.1).endswith("has 6.7 GiB free")
    ledger.reserve(A, [KEY], 7.0)  # reserved more than is free: the room is negative
    assert ledger.room(KEY) < 0
    assert text(ledger, 1.0) == "needs 1.0 GiB (+0.8 GiB CUDA context), cuda:1 on gpu-box has 0.0 GiB free (runs a1b2c3d4)"


def test_many_runs_on_a_card_are_counted_not_all_listed():
    ledger = card(total=80, free=1)
    for i in range(F.RUNS_SHOWN + 2):
        ledger.hold_running(f"run{i:05d}xyz", [KEY], 1.0)
    assert text(ledger, 2.0).endswith("(runs run00000, run00001, run00002, run00003, run00004, run00005 and 2 more)")


def test_budget_larger_than_the_card_never_fits():
    ledger = card(total=24, free=24)
    assert status(ledger, 23.25) == F.FITS
    assert status(ledger, 23.25 + 1 / GIB) == F.NEVER
    assert ledger.fits_ever([KEY], 30.0) is False
    assert text(ledger, 30.0) == "needs 30.0 GiB (+0.8 GiB CUDA context), more than cuda:1 on gpu-box has in all (24.0 GiB)"


def test_run_without_budget_holds_a_shared_card_alone():
    ledger = card(total=80, free=70)
    ledger.hold_running(A, [KEY], None)  # a canvas run, or one that started before the card was shared
    assert status(ledger, 1.0) == F.HELD
    assert text(ledger, 1.0) == ("needs 1.0 GiB (+0.8 GiB CUDA context), cuda:1 on gpu-box is held by run "
                                 "a1b2c3d4, which has no budget and holds the card alone until it ends")
    assert ledger.fits_ever([KEY], 1.0) is True
    ledger.release(A)
    assert status(ledger, 1.0) == F.FITS


def test_cuda_card_that_has_not_reported_memory_waits_for_the_heartbeat():
    ledger = card(total=None, free=None)
    assert status(ledger, 6.0) == F.UNREPORTED
    assert text(ledger, 6.0) == ("cuda:1 on gpu-box has not reported its memory yet: the budget is decided after "
                                 "the worker's next heartbeat")
    assert ledger.fits_ever([KEY], 6.0) is None


def test_shared_mps_card_cannot_admit_by_budget_until_exclusive():
    ledger = Ledger()
    ledger.set_card("mac/mps:0", "mps:0 on mac", "mps", shared=True)  # MPS reports no total
    assert status(ledger, 4.0, "mac/mps:0") == F.NO_TOTAL
    assert text(ledger, 4.0, "mac/mps:0") == (
        "mps:0 on mac is shared by memory, but an MPS device does not report its total memory, so it cannot admit "
        "runs by budget; make it exclusive again to run there")
    assert ledger.fits_ever(["mac/mps:0"], 4.0) is False
    ledger.set_shared("mac/mps:0", False)
    assert status(ledger, 4.0, "mac/mps:0") == F.NOT_SHARED


def test_run_without_budget_on_a_shared_card_waits_for_a_peak():
    ledger = card()
    assert status(ledger, None) == F.NO_BUDGET
    assert "this run has no budget: it waits until the same graph has a measured peak" in text(ledger, None)
    assert "target.memory_gib" in text(ledger, None)


def test_exclusive_and_unknown_cards():
    ledger = card(shared=False, free=0)
    assert status(ledger, 100.0) == F.NOT_SHARED  # memory does not decide there: the slot rule does
    assert text(ledger, 100.0) is None
    assert status(ledger, 1.0, "uuid:nowhere") == F.UNKNOWN_CARD
    assert "has not been reported" in text(ledger, 1.0, "uuid:nowhere")


# --- decisions -----------------------------------------------------------------------------------------


def two_cards(free0: float = 24, free1: float = 24) -> Ledger:
    ledger = Ledger()
    ledger.set_card("k0", "cuda:0 on gpu-box", "cuda", total_gib=24, free_gib=free0)
    ledger.set_card("k1", "cuda:0 on gpu-two", "cuda", total_gib=48, free_gib=free1)
    return ledger


def test_named_worker_run_that_does_not_fit_is_rejected_at_once():
    ledger = two_cards(free0=3)
    d = ledger.decide(6.0, [("k0",)], named=True)
    assert (d.action, d.reason) == ("reject", "needs 6.0 GiB (+0.8 GiB CUDA context), cuda:0 on gpu-box has 3.0 GiB free")
    assert d.message.endswith("(set target.wait to true to queue it until it fits)")


def test_named_worker_run_with_wait_true_waits():
    d = two_cards(free0=3).decide(6.0, [("k0",)], named=True, wait=True)
    assert d.action == "wait"
    assert d.reason == "waiting for memory: needs 6.0 GiB (+0.8 GiB CUDA context), cuda:0 on gpu-box has 3.0 GiB free"


def test_fitting_run_is_admitted_on_its_first_fitting_candidate():
    ledger = two_cards(free0=3, free1=40)
    assert ledger.decide(6.0, [("k0",), ("k1",)], named=False) == F.Decision("admit", 1)
    assert two_cards().decide(6.0, [("k0",), ("k1",)], named=True) == F.Decision("admit", 0)


def test_any_run_waits_until_a_card_fits():
    d = two_cards(free0=3, free1=3).decide(6.0, [("k0",), ("k1",)], named=False)
    assert d.action == "wait"
    assert "cuda:0 on gpu-box has 3.0 GiB free" in d.reason and "cuda:0 on gpu-two has 3.0 GiB free" in d.reason


def test_any_run_with_wait_false_is_rejected():
    d = two_cards(free0=3, free1=3).decide(6.0, [("k0",), ("k1",)], named=False, wait=False)
    assert d.action == "reject" and d.reason.startswith("needs 6.0 GiB")


def test_budget_larger_than_every_candidate_is_rejected_even_with_wait():
    ledger = two_cards()
    d = ledger.decide(50.0, [("k0",), ("k1",)], named=False, wait=True)
    assert d.action == "reject"
    assert d.reason == ("the budget is larger than every card the run may use: needs 50.0 GiB (+0.8 GiB CUDA "
                        "context), more than cuda:0 on gpu-box has in all (24.0 GiB); needs 50.0 GiB (+0.8 GiB "
                        "CUDA context), more than cuda:0 on gpu-two has in all (48.0 GiB)")
    assert ledger.decide(30.0, [("k0",)], named=True, wait=True).action == "reject"
    assert ledger.decide(30.0, [("k0",), ("k1",)], named=False).action == "wait"  # gpu-two's 48 GiB card, 24 free
    ledger.report("k1", 48, 48)
    assert ledger.decide(30.0, [("k0",), ("k1",)], named=False) == F.Decision("admit", 1)


def test_unreported_card_keeps_the_run_waiting_whatever_wait_says():
    ledger = two_cards(free0=3)
    ledger.set_card("k2", "cuda:1 on gpu-box", "cuda")
    d = ledger.decide(6.0, [("k2",)], named=True, wait=False)
    assert d.action == "wait" and "decided after the worker's next heartbeat" in d.reason
    d = ledger.decide(6.0, [("k0",), ("k2",)], named=False, wait=False)
    assert d.action == "wait" and "next heartbeat" in d.reason and "3.0 GiB free" not in d.reason
    ledger.report("k2", 24, 2)  # the heartbeat decides it
    assert ledger.decide(6.0, [("k2",)], named=True, wait=False).action == "reject"


def test_device_set_fits_when_every_card_fits():
    ledger = two_cards(free0=24, free1=3)
    assert ledger.candidate_status(["k0", "k1"], F.to_bytes(6)) == F.NOT_NOW
    d = ledger.decide(6.0, [("k0", "k1")], named=True)
    assert d.action == "reject" and d.reason == "needs 6.0 GiB (+0.8 GiB CUDA context), cuda:0 on gpu-two has 3.0 GiB free"
    ledger.report("k1", 48, 10)
    assert ledger.decide(6.0, [("k0", "k1")], named=True).action == "admit"
    ledger.reserve(A, ["k0", "k1"], 6.0)
    assert ledger.cards["k0"].reserved == {A: F.to_bytes(6)} and A in ledger.cards["k1"].reserved


def test_many_candidates_are_summarised():
    ledger = Ledger()
    for i in range(6):
        ledger.set_card(f"k{i}", f"cuda:{i} on box", "cuda", total_gib=24, free_gib=1 + i)
    d = ledger.decide(20.0, [(f"k{i}",) for i in range(6)], named=False)
    assert d.action == "wait" and d.reason.endswith("; and 3 other candidates")
    assert ledger.decide(1.0, [], named=False).action == "reject"


def test_no_budget_run_waits_for_a_default_even_when_named():
    assert two_cards().decide(None, [("k0",)], named=True, wait=False).action == "wait"


# --- plugging into the slot rule ------------------------------------------------------------------------


def test_admitter_counts_the_runs_admitted_before_in_the_same_pass():
    box = ProviderInfo("gpu-box", (DeviceOffer("cuda:0", uuid="GPU-1"),))
    state = build_state([box], LimitOverrides(workers={("gpu-box", "cuda:0"): 8}))
    ledger = Ledger()
    ledger.set_card(next(iter(state.slots)), "cuda:0 on gpu-box", "cuda", total_gib=24, free_gib=24)
    runs = [QueuedRun(f"run{i}", (Candidate("gpu-box", ("cuda:0",)),)) for i in range(3)]
    budgets = {"run0": 10.0, "run1": 10.0, "run2": 10.0}
    result = plan(runs, state, admit=ledger.admitter(state, budgets))
    assert [p.run_id for p in result.placements] == ["run0", "run1"]  # 2 x 10.75 <= 24 < 3 x 10.75
    assert result.waiting["run2"] == ("waiting for a free slot: needs 10.0 GiB (+0.8 GiB CUDA context), cuda:0 on "
                                      "gpu-box is taken by runs placed before this one")
    assert plan(runs[:1], state, admit=ledger.admitter(state, {"run0": 30.0})).placements == []


# --- configuration --------------------------------------------------------------------------------------


def test_context_from_the_environment():
    assert context_mib_from_env({}) == 768
    assert context_mib_from_env({"XPUFLEET_EXECUTION_CUDA_CONTEXT_MIB": " 650 "}) == 650
    with pytest.raises(ValueError, match="XPUFLEET_EXECUTION_CUDA_CONTEXT_MIB='lots' is not a whole number"):
        context_mib_from_env({"XPUFLEET_EXECUTION_CUDA_CONTEXT_MIB": "lots"})
    with pytest.raises(ValueError, match=">= 0"):
        context_mib_from_env({"XPUFLEET_EXECUTION_CUDA_CONTEXT_MIB": "-1"})
    with pytest.raises(ValueError):
        Ledger(-5)


def test_small_budgets_and_free_figures_keep_two_decimals():
    assert F.gib_text(12.0) == "12.0" and F.gib_text(0.05) == "0.05" and F.gib_text(0.14) == "0.14"
    ledger = card(total=24, free=0.57)
    assert text(ledger, 0.05) == "needs 0.05 GiB (+0.8 GiB CUDA context), cuda:1 on gpu-box has 0.57 GiB free"
