"""The ranked table, per-point summary, status and CSV (pure)."""

from __future__ import annotations

import csv
import io
import math

from xpufleet.server.sweeps.ranking import (
    Row,
    best,
    better,
    counts,
    metric_of,
    point_summary,
    ranked,
    sweep_status,
    table_csv,
)


def row(i, status="succeeded", metric=None, point=None, seed=None, **kw):
    return Row(i, i if point is None else point, {"5.lr": 0.1 * (i + 1)}, seed, f"run{i}", status, metric, **kw)


def test_metric_of_takes_finite_numbers_only():
    assert metric_of({"val_accuracy": 0.9}, "val_accuracy") == 0.9
    assert metric_of({"val_accuracy": 1}, "val_accuracy") == 1.0
    for bad in ({"val_accuracy": None}, {"val_accuracy": "0.9"}, {"val_accuracy": True}, {}, None,
                {"val_accuracy": math.nan}, {"val_accuracy": math.inf}):
        assert metric_of(bad, "val_accuracy") is None


def test_only_succeeded_runs_with_a_metric_are_ranked_best_first_ties_in_variant_order():
    rows = [row(0, metric=0.5), row(1, "failed", metric=0.99), row(2, metric=0.9), row(3, "running"),
            row(4, metric=0.9), row(5, "succeeded", None), row(6, "queued")]
    table = ranked(rows, "maximize")
    assert [(rank, r.index) for rank, r in table] == [(1, 2), (2, 4), (3, 0), (None, 1), (None, 3), (None, 5),
                                                      (None, 6)]
    assert [(rank, r.index) for rank, r in ranked(rows, "minimize")][:3] == [(1, 0), (2, 2), (3, 4)]
    assert best(rows, "maximize").index == 2 and best(rows, "minimize").index == 0
    assert best([row(0, "failed", 1.0)], "maximize") is None and best([], "maximize") is None


def test_better_is_strict_in_both_directions():
    assert better(2, 1, "maximize") and not better(1, 1, "maximize") and better(1, 2, "minimize")


def test_points_summary_mean_std_best_over_seeds_ranked_by_mean():
    rows = [row(0, metric=0.8, point=0, seed=0), row(1, metric=0.9, point=0, seed=1),
            row(2, metric=0.95, point=1, seed=0), row(3, "failed", point=1, seed=1),
            row(4, "queued", point=2, seed=0)]
    summary = point_summary(rows, "maximize")
    assert [(p["point"], p["rank"], p["runs"], p["succeeded"]) for p in summary] == [
        (1, 1, 2, 1), (0, 2, 2, 2), (2, None, 1, 0)]
    p0 = summary[1]
    assert math.isclose(p0["mean"], 0.85) and math.isclose(p0["std"], math.sqrt(0.005)) and p0["best"] == 0.9
    assert summary[0]["std"] == 0.0 and summary[2]["mean"] is None and summary[2]["best"] is None
    assert point_summary(rows, "minimize")[0]["point"] == 0 and point_summary(rows, "minimize")[0]["best"] == 0.8


def test_sweep_status_and_counts():
    assert sweep_status(["queued", "queued"], False) == "queued"
    assert sweep_status(["queued", "running"], False) == "running"
    assert sweep_status(["succeeded", "queued"], False) == "running"
    assert sweep_status(["succeeded", "failed"], False) == "finished"
    assert sweep_status(["cancelled", "running"], True) == "cancelling"
    assert sweep_status(["cancelled", "succeeded"], True) == "cancelled"
    assert sweep_status(["deleted"], False) == "finished"
    assert counts([row(0), row(1, "failed"), row(2)]) == {"succeeded": 2, "failed": 1}


def test_csv_has_one_column_per_parameter_and_every_variant():
    rows = [row(0, metric=0.5, worker_id="a", devices=["cuda:0"], queue_key="any/cuda", started_at=1.5),
            row(1, "failed", error="boom, it broke", devices=["cuda:0", "cuda:1"])]
    text = table_csv(ranked(rows, "maximize"), ["5.lr"], "val_accuracy")
    got = list(csv.DictReader(io.StringIO(text)))
    assert list(got[0]) == ["rank", "variant", "point", "run_id", "name", "status", "val_accuracy", "5.lr", "seed",
                            "worker_id", "devices", "queue_key", "started_at", "finished_at", "error"]
    assert got[0]["rank"] == "1" and got[0]["val_accuracy"] == "0.5" and got[0]["5.lr"] == "0.1"
    assert got[0]["worker_id"] == "a" and got[0]["devices"] == "cuda:0" and got[0]["started_at"] == "1.5"
    assert got[1]["rank"] == "" and got[1]["error"] == "boom, it broke" and got[1]["devices"] == "cuda:0,cuda:1"
    assert got[1]["5.lr"] == "0.2"


def test_row_json_has_what_the_table_shows():
    j = row(0, metric=0.5, worker_id="a", devices=["cuda:0"], queue_key="any/cuda").to_json(1)
    assert {k: j[k] for k in ("rank", "variant", "parameters", "metric", "status", "worker_id", "devices",
                              "queue_key")} == {"rank": 1, "variant": 0, "parameters": {"5.lr": 0.1}, "metric": 0.5,
                                                "status": "succeeded", "worker_id": "a", "devices": ["cuda:0"],
                                                "queue_key": "any/cuda"}
