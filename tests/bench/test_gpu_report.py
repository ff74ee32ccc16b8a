"""The GPU check's pure part (bench/gpu_report.py): goals, verdicts, the time plan, the lines and the report."""

from __future__ import annotations

import math

import gpu_report as R
import pytest


def test_eight_checks_with_goals_and_limits_that_fit_the_total():
    assert R.CHECK_NAMES == ("training", "estimate_peaks", "cap", "nvml", "warm_start", "ddp_nccl", "model_server",
                             "default_budget")
    assert all(c.goal and c.title and c.timeout_s > 0 for c in R.CHECKS)
    assert R.TOTAL_BUDGET_S + 60 <= 8 * 60  # make gpu-check's 8 minutes, with room for start-up and pytest
    with pytest.raises(ValueError, match="unknown check 'nope': choose from training, "):
        R.check_named("nope")


def test_goals_are_met_only_by_finite_figures_inside_them():
    assert R.at_least(0.97, R.TRAINING_GOAL) and not R.at_least(0.969, R.TRAINING_GOAL)
    assert not R.at_least(math.nan, 0.0) and not R.at_least(None, 0.0) and not R.at_least(True, 0.0)
    lo, hi = R.ESTIMATE_RANGE
    assert R.within(1.0, lo, hi) and R.within(1.3, lo, hi)
    assert not R.within(0.99, lo, hi) and not R.within(1.31, lo, hi) and not R.within(math.inf, lo, hi)
    assert R.ratio(3.0, 2.0) == 1.5 and math.isnan(R.ratio(1.0, 0.0)) and math.isnan(R.ratio(None, 1.0))


def test_weights_differ_by_their_largest_element_and_a_different_model_never_matches():
    a = {"w": [1.0, 2.0, 3.0], "b": [0.5]}
    assert R.max_abs_diff(a, {"w": [1.0, 2.00005, 2.9999], "b": [0.5]}) == pytest.approx(1e-4)
    assert R.max_abs_diff(a, {"w": [1.0, 2.0, 3.0]}) == math.inf  # a missing tensor
    assert R.max_abs_diff(a, {"w": [1.0, 2.0], "b": [0.5]}) == math.inf  # another shape
    assert R.max_abs_diff({"w": [math.nan]}, {"w": [math.nan]}) == math.inf


def test_a_runs_result_leaves_out_its_timings():
    metrics = {"final_train_loss": 0.25, "samples_per_s": 1234.5, "train_seconds": 2.0, "val_accuracy": 0.9,
               "train_loss_batch": [[1, 0.5], [2, 0.4]], "label": "text"}
    assert R.metrics_numbers(metrics) == {"final_train_loss": [0.25], "val_accuracy": [0.9],
                                          "train_loss_batch": [1.0, 0.5, 2.0, 0.4]}


def test_only_a_cuda_run_is_judged():
    assert R.verdict("cuda", True) == "pass" and R.verdict("cuda", False) == "fail"
    assert R.verdict("cpu", True) == "dry" and R.verdict("cpu", False) == "dry"
    with pytest.raises(ValueError, match="status must be one of"):
        R.Outcome("training", "ok")


def test_the_time_plan_cuts_a_check_to_what_is_left_and_skips_it_when_too_little_is():
    check = R.check_named("cap")  # 50 s
    assert R.time_for(check, 400.0) == 50.0
    assert R.time_for(check, 30.0) == 30.0
    assert R.time_for(check, 16.0) is None  # under a third of its limit: it would only time out
    assert R.time_for(check, math.inf, scale=6.0) == 300.0  # a dry run: slower limits, no total


def test_lines_say_status_figure_goal_and_why_and_a_dry_line_says_it_is_no_gpu_figure():
    ok = R.Outcome("training", "pass", {"ratio": 0.99}, "node / hand-written samples/s 0.990", elapsed_s=12.34)
    assert R.format_line(ok) == ("[PASS]    training: node / hand-written samples/s 0.990 (goal: node / hand-written "
                                 ">= 0.97) [12.3 s]")
    bad = R.Outcome("nvml", "fail", {}, "NVML 1.2 GiB - reserved 0.1 GiB = 1126 MiB", "outside [0, allowance]")
    assert R.format_line(bad).startswith("[FAIL]    nvml: NVML 1.2 GiB") and "; outside [0, allowance]" in \
        R.format_line(bad)
    dry = R.Outcome("cap", "dry", {}, "over budget: failed", device="cpu")
    assert R.format_line(dry).startswith("[DRY]     cap: cpu dry run, not a GPU figure: over budget: failed")
    assert R.format_line(R.Outcome("ddp_nccl", "error", detail="boom")).startswith("[ERROR]   ddp_nccl: no figure")


def test_the_no_gpu_listing_names_every_check_with_its_goal():
    lines = R.listing()
    assert len(lines) == 8 and lines[0].startswith("  1. training: TrainingLoop on cuda")
    assert all(c.goal in line for c, line in zip(R.CHECKS, lines, strict=True))


def test_the_report_round_trips_and_says_what_was_checked():
    outcomes = [R.Outcome("training", "pass", {"ratio": 0.99}, "0.99", elapsed_s=3.0),
                R.Outcome("cap", "fail", {}, "x", "the neighbour failed")]
    report = R.build_report(outcomes, mode="gpu", gpu={"available": True, "count": 1}, elapsed_s=10.0,
                            load_avg=(1.0, 0.5, 0.25), started_at="2026-12-03T12:00:00+00:00")
    assert report["schema"] == R.SCHEMA and report["nothing_checked"] is False and report["ok"] is False
    assert report["summary"]["pass"] == 1 and report["summary"]["fail"] == 1
    entry = report["checks"][0]
    assert entry["gpu_figure"] is True and entry["goal"] == R.check_named("training").goal
    assert R.outcome_of(report, "cap") == outcomes[1] and R.outcome_of(report, "nvml") is None
    with pytest.raises(ValueError, match="mode must be"):
        R.build_report([], mode="fast", gpu={}, elapsed_s=0, load_avg=(0, 0, 0), started_at="")


def test_success_is_every_check_passed_or_dry_or_nothing_checked_for_want_of_a_gpu():
    none = [R.Outcome(n, "not_run", detail=R.NO_GPU_TEXT) for n in R.CHECK_NAMES]
    assert R.passed(none)
    assert R.passed([R.Outcome("training", "dry", device="cpu"), R.Outcome("cap", "pass")])
    assert not R.passed([R.Outcome("cap", "pass"), R.Outcome("nvml", "not_run", detail="the 8-minute budget ran out")])
    assert not R.passed([R.Outcome("cap", "timeout")]) and not R.passed([R.Outcome("cap", "error")])
    report = R.build_report([R.Outcome("cap", "dry", device="cpu")], mode="dry-cpu", gpu={}, elapsed_s=1,
                            load_avg=(0, 0, 0), started_at="")
    assert report["nothing_checked"] is True and report["checks"][0]["gpu_figure"] is False
