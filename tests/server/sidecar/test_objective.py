"""The Runs panel row's headline (server/sidecar/objective.py): the objective a run's metrics end with."""

from __future__ import annotations

from xpufleet.server.sidecar.objective import run_objective


def test_validation_accuracy_comes_before_any_loss_and_throughput_never_counts():
    final = {"train_loss": 0.31, "val_loss": 0.4, "val_accuracy": 0.93, "samples_per_s": 712.0,
             "eval_loss": 0.5, "eval_accuracy": 0.9}
    assert run_objective(final) == {"metric": "val_accuracy", "value": 0.93, "direction": "maximize"}
    assert run_objective({"eval_loss": 0.5, "train_loss": 0.3}) == {"metric": "eval_loss", "value": 0.5,
                                                                    "direction": "minimize"}
    assert run_objective({"train_loss": 0.3, "samples_per_s": 700}) == {"metric": "train_loss", "value": 0.3,
                                                                        "direction": "minimize"}


def test_other_names_fall_back_to_an_accuracy_then_a_loss_and_nothing_else():
    assert run_objective({"top5_acc": 0.8, "my_loss": 1.0})["metric"] == "top5_acc"
    assert run_objective({"my_loss": 1.0, "lr": 0.1}) == {"metric": "my_loss", "value": 1.0, "direction": "minimize"}
    assert run_objective({"samples_per_s": 700.0, "lr": 0.1}) is None
    assert run_objective(None) is None and run_objective({}) is None
    # a value that is not a finite number is never a headline
    assert run_objective({"val_accuracy": float("nan"), "val_loss": 0.2})["metric"] == "val_loss"
    assert run_objective({"val_accuracy": None, "val_loss": True}) is None
