"""A sweep -> its variants -> each child's POST /api/runs body (pure)."""

from __future__ import annotations

import json
from pathlib import Path

from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.sweeps.expand import child_name, points, probe_points, study_child, sweep_child, variants
from xpufleet.server.sweeps.spec import parse_study, parse_sweep

GRAPH = json.loads((Path(__file__).resolve().parents[3] / "samples" / "mlp_digits.json").read_text())
OBJ = {"metric": "val_accuracy"}


def test_grid_points_first_parameter_slowest_and_seeds_within_a_point():
    spec = parse_sweep({"graph": GRAPH, "objective": OBJ, "seeds": [5, 6],
                        "parameters": {"5.lr": [0.1, 0.01], "4.hidden": ["64", "32"]}})
    assert points(spec) == [{"5.lr": 0.1, "4.hidden": "64"}, {"5.lr": 0.1, "4.hidden": "32"},
                            {"5.lr": 0.01, "4.hidden": "64"}, {"5.lr": 0.01, "4.hidden": "32"}]
    vs = variants(spec)
    assert [(v.index, v.point, v.seed) for v in vs] == [(i, i // 2, (5, 6)[i % 2]) for i in range(8)]
    assert vs[3].values == {"5.lr": 0.1, "4.hidden": "32"}


def test_a_seed_only_sweep_is_the_base_graph_once_per_seed():
    spec = parse_sweep({"graph": GRAPH, "objective": OBJ, "seeds": 3})
    assert [(v.values, v.seed) for v in variants(spec)] == [({}, 0), ({}, 1), ({}, 2)]


def test_random_points_are_reproducible_by_random_seed():
    body = {"graph": GRAPH, "objective": OBJ, "mode": "random", "samples": 6, "random_seed": 11,
            "parameters": {"5.lr": {"low": 1e-4, "high": 0.1, "log": True}, "4.hidden": ["64", "128"]}}
    a, b = points(parse_sweep(body)), points(parse_sweep(body))
    assert a == b and len(a) == 6 and all(1e-4 <= p["5.lr"] <= 0.1 for p in a)
    assert points(parse_sweep({**body, "random_seed": 12})) != a


def test_each_child_body_is_a_valid_post_api_runs_body_with_the_sweeps_options():
    spec = parse_sweep({"graph": GRAPH, "objective": OBJ, "name": "lr", "seeds": 2,
                        "parameters": {"5.lr": [0.1, 0.01]}, "set": {"10.location": "run_dir"},
                        "options": {"device": "cuda", "deterministic": True, "target": {"worker": "any"}}})
    bodies = [sweep_child(spec, v) for v in variants(spec)]
    reqs = [parse_run_request(b) for b in bodies]
    assert [r.name for r in reqs] == ["lr #0 5.lr=0.1 seed=0", "lr #1 5.lr=0.1 seed=1", "lr #2 5.lr=0.01 seed=0",
                                      "lr #3 5.lr=0.01 seed=1"]
    assert [r.seed for r in reqs] == [0, 1, 0, 1]
    assert all(r.target.worker == "any" and r.target.device == "cuda" and r.options["deterministic"] for r in reqs)
    assert [r.graph["5"]["inputs"]["lr"] for r in reqs] == [0.1, 0.1, 0.01, 0.01]
    assert all(r.graph["10"]["inputs"]["location"] == "run_dir" for r in reqs)
    assert GRAPH["10"]["inputs"]["location"] == "outputs" and spec.options == {
        "device": "cuda", "deterministic": True, "target": {"worker": "any"}}  # nothing shared was changed


def test_study_children_and_probe_points():
    spec = parse_study({"graph": GRAPH, "objective": OBJ, "name": "s", "n_trials": 4,
                        "parameters": {"5.lr": {"low": 1e-4, "high": 0.1, "log": True}, "5.name": ["adam", "sgd", "rmsprop"]}})
    body = study_child(spec, 3, {"5.lr": 0.01, "5.name": "sgd"})
    req = parse_run_request(body)
    assert req.name == "s trial 3 5.lr=0.01 5.name=sgd" and req.seed is None
    assert req.graph["5"]["inputs"] == {**GRAPH["5"]["inputs"], "lr": 0.01, "name": "sgd"}
    assert probe_points(spec.params) == [{"5.lr": 1e-4, "5.name": "adam"}, {"5.lr": 0.1, "5.name": "adam"},
                                         {"5.lr": 1e-4, "5.name": "sgd"}, {"5.lr": 1e-4, "5.name": "rmsprop"}]
    assert len(probe_points(spec.params, limit=2)) == 2


def test_child_names():
    assert child_name("sw", "#2", {"5.lr": 0.008, "4.hidden": "64,32"}, 1) == "sw #2 5.lr=0.008 4.hidden=64,32 seed=1"
    assert child_name("sw", "#0", {}, None) == "sw #0"
