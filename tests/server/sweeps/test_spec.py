"""The bodies of POST /api/sweeps and POST /api/studies (pure): every field, defaults, caps that reject."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpufleet.constants import SWEEP_DEFAULT_MAX_RUNS, SWEEP_MAX_RUNS
from xpufleet.server.sweeps.params import SpecError
from xpufleet.server.sweeps.spec import METRIC_DIRECTIONS, parse_study, parse_sweep

GRAPH = json.loads((Path(__file__).resolve().parents[3] / "samples" / "mlp_digits.json").read_text())
OBJ = {"metric": "val_accuracy"}


def sweep(**kw):
    return parse_sweep({"graph": GRAPH, "objective": OBJ, **kw})


def study(**kw):
    body = {"graph": GRAPH, "objective": OBJ, "parameters": {"5.lr": {"low": 1e-4, "high": 0.1, "log": True}},
            "n_trials": 8, **kw}
    return parse_study(body)


def test_a_grid_sweep_with_defaults():
    s = sweep(parameters={"5.lr": [0.001, 0.01], "4.hidden": ["64", "32"]})
    assert s.name == "sweep" and s.mode == "grid" and s.seeds is None and s.max_runs == SWEEP_DEFAULT_MAX_RUNS
    assert s.objective.metric == "val_accuracy" and s.objective.direction == "maximize"
    assert s.n_points == 4 and s.n_runs == 4 and s.options == {} and s.fixed == {}


def test_seeds_multiply_points_and_exclude_options_seed():
    s = sweep(parameters={"5.lr": [0.001, 0.01]}, seeds=3)
    assert s.seeds == (0, 1, 2) and s.n_runs == 6
    assert sweep(parameters={"5.lr": [0.1]}, seeds=[7, 9]).seeds == (7, 9)
    assert sweep(seeds=4).n_runs == 4  # seeds only: the same graph four times
    for raw, needle in [(0, "seeds: must be an integer between 1"), ([], "a list of 1 to"), ([1, 1], "lists a seed twice"),
                        ([-1], "seeds: must be an integer between 0"), ("3", "must be an integer")]:
        with pytest.raises(SpecError, match=needle):
            sweep(parameters={"5.lr": [0.1]}, seeds=raw)
    with pytest.raises(SpecError, match="give seeds .* or options.seed .*, not both"):
        sweep(parameters={"5.lr": [0.1]}, seeds=2, options={"seed": 1})
    with pytest.raises(SpecError, match="name at least one parameter"):
        sweep()


def test_the_cap_rejects_rather_than_truncates_and_says_how_many():
    with pytest.raises(SpecError) as exc:
        sweep(parameters={"5.lr": {"low": 1e-4, "high": 1, "log": True, "steps": 50}}, seeds=3, max_runs=100)
    assert str(exc.value) == ("the sweep would queue 150 runs (50 points x 3 seeds) and max_runs is 100: narrow the "
                              f"grid (or draw fewer samples), or raise max_runs (at most {SWEEP_MAX_RUNS})")
    assert sweep(parameters={"5.lr": {"low": 1e-4, "high": 1, "log": True, "steps": 50}}, seeds=3,
                 max_runs=150).n_runs == 150
    huge = {f"{n}": {"low": 0, "high": 1, "steps": 100} for n in ("5.lr", "5.momentum", "5.weight_decay")}
    with pytest.raises(SpecError, match=f"would queue more than {SWEEP_MAX_RUNS} runs and max_runs is 1000"):
        sweep(parameters=huge)
    with pytest.raises(SpecError, match=f"max_runs: must be an integer between 1 and {SWEEP_MAX_RUNS}"):
        sweep(parameters={"5.lr": [0.1]}, max_runs=SWEEP_MAX_RUNS + 1)
    with pytest.raises(SpecError, match="would queue 1001 runs"):
        sweep(mode="random", samples=1001, parameters={"5.lr": {"low": 0.001, "high": 0.1}})


def test_random_mode_needs_samples_and_grid_mode_refuses_them():
    s = sweep(mode="random", samples=5, random_seed=3, parameters={"5.lr": {"low": 1e-4, "high": 0.1, "log": True}})
    assert (s.n_runs, s.random_seed) == (5, 3)
    with pytest.raises(SpecError, match="a random sweep needs the number of points"):
        sweep(mode="random", parameters={"5.lr": [0.1]})
    with pytest.raises(SpecError, match="only a random sweep has samples"):
        sweep(samples=3, parameters={"5.lr": [0.1]})
    with pytest.raises(SpecError, match="only a random sweep has random_seed"):
        sweep(random_seed=3, parameters={"5.lr": [0.1]})
    with pytest.raises(SpecError, match="mode: must be grid or random"):
        sweep(mode="bayes", parameters={"5.lr": [0.1]})


def test_objective_directions_known_and_explicit():
    for metric, direction in METRIC_DIRECTIONS.items():
        assert sweep(parameters={"5.lr": [0.1]}, objective={"metric": metric}).objective.direction == direction
    assert sweep(parameters={"5.lr": [0.1]}, objective={"metric": "f1", "direction": "maximize"}).objective.metric == "f1"
    for obj, needle in [(None, "objective: missing"), ("val_accuracy", "objective: missing"),
                        ({"metric": ""}, "objective.metric"), ({"metric": "f1"}, "give maximize or minimize for the metric 'f1'"),
                        ({"metric": "val_loss", "direction": "down"}, "must be maximize or minimize"),
                        ({"metric": "val_loss", "goal": 1}, r"unknown field\(s\) goal")]:
        with pytest.raises(SpecError, match=needle):
            parse_sweep({"graph": GRAPH, "objective": obj, "parameters": {"5.lr": [0.1]}})


def test_set_gives_every_variant_one_value_and_may_not_overlap_parameters():
    s = sweep(parameters={"5.lr": [0.1]}, set={"10.location": "run_dir", "8.epochs": 3})
    assert s.fixed == {"10.location": "run_dir", "8.epochs": 3}
    with pytest.raises(SpecError, match="5.lr: both varied"):
        sweep(parameters={"5.lr": [0.1]}, set={"5.lr": 0.2})
    with pytest.raises(SpecError, match="must be one value"):
        sweep(parameters={"5.lr": [0.1]}, set={"8.epochs": [1, 2]})
    with pytest.raises(SpecError, match="set: must be an object"):
        sweep(parameters={"5.lr": [0.1]}, set=["8.epochs"])


@pytest.mark.parametrize("body, needle", [
    ([], "the body must be an object"),
    ({"graph": GRAPH, "objective": OBJ, "paramters": {}}, "unknown field(s) paramters; a sweep has name, graph"),
    ({"objective": OBJ, "parameters": {"5.lr": [1.0]}}, "graph: missing"),
    ({"graph": "mlp_digits.json", "objective": OBJ}, "the CLI reads a file path for you"),
    ({"graph": {"1": {"inputs": {}}}, "objective": OBJ}, "graph['1']: a node must be an object with class_type"),
    ({"graph": {"1": {"class_type": "X", "inputs": []}}, "objective": OBJ}, "graph['1'].inputs: must be an object"),
    ({"graph": GRAPH, "objective": OBJ, "name": " "}, "name: must be a non-empty string"),
    ({"graph": GRAPH, "objective": OBJ, "options": []}, "options: must be an object"),
    ({"graph": GRAPH, "objective": OBJ, "options": {"name": "x"}}, "options.name: each run is named after the sweep"),
])
def test_bad_sweep_bodies(body, needle):
    with pytest.raises(SpecError) as exc:
        parse_sweep(body)
    assert needle in str(exc.value)


def test_a_study_with_defaults_and_every_field():
    s = study()
    assert (s.name, s.n_trials, s.parallel, s.pruner.kind, s.sampler.kind, s.sampler.seed) == \
        ("study", 8, 1, "none", "tpe", None)
    s = study(name="lr", parallel=3, pruner={"type": "median", "metric": "val_loss_step", "n_startup_trials": 2,
                                            "n_warmup_steps": 10, "interval_steps": 5},
              sampler={"type": "random", "seed": 4}, set={"8.epochs": 5}, options={"device": "cuda"})
    assert (s.parallel, s.pruner.metric, s.pruner.direction, s.pruner.n_startup_trials, s.pruner.n_warmup_steps,
            s.pruner.interval_steps) == (3, "val_loss_step", "minimize", 2, 10, 5)
    assert (s.sampler.kind, s.sampler.seed, s.fixed, s.options) == ("random", 4, {"8.epochs": 5}, {"device": "cuda"})
    assert study(parallel=20).parallel == 8  # never more in flight than the budget
    assert study(pruner="median").pruner.metric == "val_accuracy"  # the objective's metric by default
    assert study(pruner="median").pruner.direction == "maximize"


@pytest.mark.parametrize("kw, needle", [
    ({"n_trials": None}, "n_trials: the study's trial budget"),
    ({"n_trials": 0}, "n_trials: must be an integer between 1"),
    ({"n_trials": 50, "max_runs": 20}, "n_trials is 50 and max_runs is 20"),
    ({"parallel": 0}, "parallel: must be an integer between 1"),
    ({"parameters": {"5.lr": {"low": 0.1, "high": 1, "steps": 4}}}, "only a grid has steps"),
    ({"pruner": {"type": "hyperband"}}, "pruner.type: must be one of median, none"),
    ({"pruner": {"type": "none", "metric": "x"}}, "type none takes no other field"),
    ({"pruner": {"metric": "f1"}}, "pruner.direction: give maximize or minimize for the metric 'f1'"),
    ({"pruner": {"metric": "val_loss", "direction": "up"}}, "pruner.direction: must be maximize or minimize"),
    ({"pruner": {"patience": 3}}, "pruner: unknown field(s) patience"),
    ({"pruner": 3}, "pruner: give"),
    ({"pruner": {"n_startup_trials": -1}}, "pruner.n_startup_trials: must be an integer"),
    ({"sampler": {"type": "cmaes"}}, "sampler.type: must be one of tpe, random"),
    ({"sampler": {"seed": -2}}, "sampler.seed: must be an integer"),
    ({"sampler": {"type": "tpe", "n": 1}}, "sampler: unknown field(s) n"),
    ({"samples": 3}, "unknown field(s) samples; a study has"),
])
def test_bad_study_bodies(kw, needle):
    body = {"graph": GRAPH, "objective": OBJ, "parameters": {"5.lr": {"low": 1e-4, "high": 0.1, "log": True}},
            "n_trials": 8, **kw}
    body = {k: v for k, v in body.items() if v is not None}
    with pytest.raises(SpecError) as exc:
        parse_study(body)
    assert needle in str(exc.value)
