"""Node parameters of sweeps and studies (pure): paths in the graph, lists, ranges, grids, draws, apply."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from xpufleet.server.sweeps.params import (
    MAX_VALUES,
    Choice,
    Range,
    SpecError,
    apply_values,
    clean_number,
    grid_size,
    grid_values,
    parse_domain,
    parse_params,
    probe_values,
    resolve_path,
    sample,
)

GRAPH = json.loads((Path(__file__).resolve().parents[3] / "samples" / "mlp_digits.json").read_text())


def test_a_path_names_a_node_and_one_of_its_value_inputs():
    assert resolve_path("5.lr", GRAPH, "p") == ("5", "lr")
    assert resolve_path("4.hidden", GRAPH, "p") == ("4", "hidden")


@pytest.mark.parametrize("path, needle", [
    ("lr", "write \"<node id>.<input>\""),
    (5, "is not a parameter"),
    ("99.lr", "the graph has no node '99' (its nodes: 1 (XPUDataset), 2 (XPUDataLoader)"),
    ("5.", "names no input after the dot"),
    ("5.lrr", "node 5 (XPUOptimizer) has no input 'lrr' (its value inputs: lr, momentum, name, weight_decay)"),
    ("8.model", "input model of node 8 (XPUTrainingLoop) is a link from node 4, not a value"),
])
def test_bad_paths_say_what_to_write(path, needle):
    with pytest.raises(SpecError) as exc:
        resolve_path(path, GRAPH, "parameters['x']")
    assert needle in str(exc.value) and str(exc.value).startswith("parameters['x']: ")


def test_an_input_the_graph_leaves_out_is_accepted_when_the_node_class_declares_it():
    declared = {"XPUTrainingLoop": {"epochs", "val_every_steps"}}
    assert resolve_path("8.val_every_steps", GRAPH, "p", lambda ct: declared.get(ct)) == ("8", "val_every_steps")
    with pytest.raises(SpecError, match="has no input 'val_every_steps'"):
        resolve_path("8.val_every_steps", GRAPH, "p")  # unknown class here: only the graph's own inputs
    with pytest.raises(SpecError, match="has no input 'nope'"):
        resolve_path("8.nope", GRAPH, "p", lambda ct: declared.get(ct))


def test_node_ids_may_hold_dots_the_input_is_after_the_last_one():
    graph = {"12.3": {"class_type": "X", "inputs": {"a": 1}}}
    assert resolve_path("12.3.a", graph, "p") == ("12.3", "a")


def test_lists_keep_their_order_and_refuse_repeats_and_non_scalars():
    assert parse_domain([0.1, 0.01], "f", 0.002, "grid") == Choice((0.1, 0.01))
    assert parse_domain({"values": ["64", "128,64"]}, "f", "64", "random") == Choice(("64", "128,64"))
    assert parse_domain([True, 1], "f", None, "grid") == Choice((True, 1))  # a bool is not the int 1
    for raw, needle in [([], "non-empty list"), ({"values": []}, "non-empty list"), ([1, 1], "listed twice"),
                        ([[1]], "is not a number, string or boolean"), ([float("nan")], "is not a number"),
                        ({"values": [1], "log": True}, "a list of values takes no log"),
                        (list(range(MAX_VALUES + 1)), f"at most {MAX_VALUES}"), ("x", "give a list")]:
        with pytest.raises(SpecError, match=needle):
            parse_domain(raw, "f", None, "grid")


def test_a_range_takes_the_type_of_the_value_the_graph_holds():
    assert parse_domain({"low": 1, "high": 3, "steps": 3}, "f", 0.5, "grid").kind == "float"
    assert parse_domain({"low": 16, "high": 64, "step": 16}, "f", 64, "grid").kind == "int"
    assert parse_domain({"low": 1, "high": 4}, "f", None, "random").kind == "int"  # absent: as written
    assert parse_domain({"low": 1, "high": 4.5}, "f", None, "random").kind == "float"
    assert parse_domain({"low": 1, "high": 4, "type": "float"}, "f", 3, "random").kind == "float"
    assert parse_domain({"low": 0, "high": 1}, "f", True, "random").kind == "int"  # a bool value is no number


@pytest.mark.parametrize("raw, mode, needle", [
    ({"low": 1}, "grid", "a range needs low and high"),
    ({"low": 2, "high": 1, "steps": 2}, "grid", "low (2) must be below high (1)"),
    ({"low": 1, "high": 1, "steps": 2}, "grid", "for one value write values: [1]"),
    ({"low": "1e-4", "high": 1, "steps": 2}, "grid", "YAML 1.1 reads 1e-4 as text; write 1.0e-4"),
    ({"low": "a", "high": 1, "steps": 2}, "grid", "low: must be a finite number, got 'a'"),
    ({"low": 0, "high": 1, "log": True, "steps": 3}, "grid", "a log range needs low > 0"),
    ({"low": 0, "high": 1, "log": "yes", "steps": 3}, "grid", "log: must be true or false"),
    ({"low": 0, "high": 1, "type": "str"}, "random", "type: must be int or float"),
    ({"low": 0.5, "high": 3, "type": "int"}, "random", "an int range needs whole low and high"),
    ({"low": 0, "high": 1, "steps": 2, "step": 0.5}, "grid", "give steps or step, not both"),
    ({"low": 0, "high": 1, "steps": 5}, "random", "only a grid has steps"),
    ({"low": 0, "high": 1, "steps": 1}, "grid", "steps: must be an integer between 2"),
    ({"low": 0, "high": 1, "step": -1}, "grid", "step: must be a positive number"),
    ({"low": 1, "high": 10, "step": 1, "log": True}, "grid", "a log range takes steps, not step"),
    ({"low": 0, "high": 10, "step": 0.5, "type": "int"}, "grid", "an int range needs a whole step"),
    ({"low": 0, "high": 1, "step": 1e-9}, "grid", f"gives more than {MAX_VALUES} values"),
    ({"low": 0, "high": 1}, "grid", "a grid range needs steps"),
    ({"low": 0, "high": 1, "size": 3}, "grid", "unknown field(s) size"),
])
def test_bad_ranges_name_the_field(raw, mode, needle):
    with pytest.raises(SpecError) as exc:
        parse_domain(raw, "parameters['5.lr']", 0.1, mode)
    assert needle in str(exc.value) and str(exc.value).startswith("parameters['5.lr']")


def test_grid_values_of_lists_linear_and_log_ranges_and_steps():
    assert grid_values(Choice((3, 1))) == (3, 1)
    assert grid_values(Range(0.0, 1.0, "float", steps=5)) == (0.0, 0.25, 0.5, 0.75, 1.0)
    assert grid_values(Range(1e-4, 1e-1, "float", log=True, steps=4)) == (1e-4, 1e-3, 1e-2, 1e-1)
    assert grid_values(Range(0.0, 0.3, "float", step=0.1)) == (0.0, 0.1, 0.2, 0.3)  # high kept despite float noise
    assert grid_values(Range(0.0, 0.35, "float", step=0.1)) == (0.0, 0.1, 0.2, 0.3)
    assert grid_values(Range(16, 64, "int", step=16)) == (16, 32, 48, 64)
    assert grid_values(Range(1, 1000, "int", log=True, steps=4)) == (1, 10, 100, 1000)
    for d in (Range(0.0, 1.0, "float", steps=7), Range(0.0, 0.35, "float", step=0.1), Choice((1, 2)),
              Range(1, 1000, "int", log=True, steps=4)):
        assert grid_size(d) == len(grid_values(d))


def test_an_int_grid_that_repeats_after_rounding_is_refused_not_deduplicated():
    with pytest.raises(SpecError, match=r"repeats values after rounding \(1, 2, 2, 2, 3\); use fewer steps"):
        grid_values(Range(1, 3, "int", steps=5))


def test_clean_numbers_read_as_written():
    assert clean_number(0.1 + 0.2) == 0.3 and clean_number(1e-4 * 3) == 0.0003


def test_random_draws_stay_in_range_are_reproducible_and_log_uniform():
    rng = random.Random(0)
    log_range = Range(1e-4, 1.0, "float", log=True)
    draws = [sample(log_range, rng) for _ in range(4000)]
    assert all(1e-4 <= v <= 1.0 for v in draws)
    decades = [sum(1 for v in draws if 10 ** (k - 4) <= v < 10 ** (k - 3)) for k in range(4)]
    assert all(850 < n < 1150 for n in decades), decades  # ~1000 per decade: log-uniform
    assert [sample(log_range, random.Random(7)) for _ in range(3)] == [sample(log_range, random.Random(7))
                                                                       for _ in range(3)]
    ints = {sample(Range(1, 4, "int"), rng) for _ in range(400)}
    assert ints == {1, 2, 3, 4}
    stepped = {sample(Range(0.0, 1.0, "float", step=0.25), rng) for _ in range(400)}
    assert stepped == {0.0, 0.25, 0.5, 0.75, 1.0}
    assert {sample(Choice(("a", "b")), rng) for _ in range(100)} == {"a", "b"}
    linear = [sample(Range(-1.0, 1.0, "float"), rng) for _ in range(2000)]
    assert abs(sum(linear) / len(linear)) < 0.1 and min(linear) >= -1 and max(linear) <= 1


def test_probe_values_are_both_ends_or_every_listed_value():
    assert probe_values(Range(1e-4, 0.3, "float", log=True)) == (1e-4, 0.3)
    assert probe_values(Choice(("sgd", "adam"))) == ("sgd", "adam")


def test_parse_params_in_order_with_duplicates_and_caps():
    params = parse_params({"5.lr": [0.1, 0.01], "4.hidden": ["64", "32"]}, GRAPH, "grid")
    assert [p.path for p in params] == ["5.lr", "4.hidden"] and params[0].node == "5" and params[1].input == "hidden"
    with pytest.raises(SpecError, match="name at least one parameter"):
        parse_params({}, GRAPH, "grid")
    assert parse_params(None, GRAPH, "grid", allow_empty=True) == ()
    with pytest.raises(SpecError, match="must be an object"):
        parse_params([["5.lr", 1]], GRAPH, "grid")
    with pytest.raises(SpecError, match="parameters\\['5.lr'\\].steps"):
        parse_params({"5.lr": {"low": 0.1, "high": 1, "steps": 1}}, GRAPH, "grid")


def test_apply_values_copies_only_the_nodes_it_changes():
    params = parse_params({"5.lr": [0.1], "8.epochs": [3]}, GRAPH, "grid")
    out = apply_values(GRAPH, {"5.lr": 0.1, "8.epochs": 3, "10.location": "run_dir"}, params)
    assert out["5"]["inputs"]["lr"] == 0.1 and out["8"]["inputs"]["epochs"] == 3
    assert out["10"]["inputs"]["location"] == "run_dir"
    assert GRAPH["5"]["inputs"]["lr"] == 0.002 and GRAPH["8"]["inputs"]["epochs"] == 20  # the base is unchanged
    assert out["1"] is GRAPH["1"] and out["5"] is not GRAPH["5"]
    assert out["5"]["inputs"]["name"] == "adam"  # the node's other inputs kept
    assert math.isclose(json.loads(json.dumps(out))["5"]["inputs"]["lr"], 0.1)
