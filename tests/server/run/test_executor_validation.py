"""Graph validation: every kind of error names the node and the input, in ComfyUI's shape."""

from __future__ import annotations

import json

import pytest

from xpufleet.server.run.executor import (
    GraphValidationError,
    check_graph,
    execute_graph,
    format_errors,
    topological_order,
    validate_graph,
    validate_report,
)


class Source:
    """A tiny test node producing a number (test fixture, not a product node)."""

    @classmethod
    def INPUT_TYPES(cls):
        return {
            "required": {
                "value": ("INT", {"default": 1, "min": 0, "max": 10}),
                "scale": ("FLOAT", {"default": 1.0, "min": 0.0, "max": 2.0}),
                "mode": (["add", "mul"],),
            },
            "optional": {"label": ("STRING", {"default": ""}), "flag": ("BOOLEAN", {"default": False})},
        }

    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "run"
    CATEGORY = "test"

    def run(self, value, scale, mode, label="", flag=False):
        return (value * scale,)


class Sink:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"x": ("NUMBER",), "y": ("NUMBER",)}}

    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "run"
    OUTPUT_NODE = True
    CATEGORY = "test"

    def run(self, x, y):
        return {"ui": {"sum": [x + y]}, "result": (x + y,)}


class Text:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"default": ""})}}

    RETURN_TYPES = ("TEXT",)
    FUNCTION = "run"

    def run(self, text):
        return (text,)


CLASSES = {"Source": Source, "Sink": Sink, "Text": Text}


def good_graph():
    return {
        "1": {"class_type": "Source", "inputs": {"value": 3, "scale": 2.0, "mode": "add"}},
        "2": {"class_type": "Source", "inputs": {"value": 4, "scale": 1.0, "mode": "mul"}},
        "3": {"class_type": "Sink", "inputs": {"x": ["1", 0], "y": ["2", 0]}},
    }


def only_error(graph):
    errors = validate_graph(graph, CLASSES)
    assert len(errors) == 1, errors
    return errors[0]


def test_good_graph_runs_in_topological_order():
    result = execute_graph(good_graph(), node_classes=CLASSES)
    assert result.outputs["3"] == (10.0,)
    assert result.ui["3"] == {"sum": [10.0]}
    assert result.order.index("3") > result.order.index("1")


def test_unknown_class_type_names_the_node():
    g = good_graph()
    g["2"]["class_type"] = "Nope"
    e = only_error(g)
    assert e.type == "invalid_prompt" and e.node_id == "2"
    assert "node 2" in e.message and "'Nope'" in e.message


def test_missing_required_input_names_node_and_input():
    g = good_graph()
    del g["3"]["inputs"]["y"]
    e = only_error(g)
    assert e.type == "required_input_missing"
    assert e.input_name == "y" and "'y'" in e.message and "node 3 (Sink)" in e.message


def test_wrong_link_type_names_both_ends():
    g = good_graph()
    g["4"] = {"class_type": "Text", "inputs": {"text": "hi"}}
    g["3"]["inputs"]["y"] = ["4", 0]
    e = only_error(g)
    assert e.type == "return_type_mismatch" and e.input_name == "y"
    assert "node 3 (Sink)" in e.message and "node 4 (Text)" in e.message and "TEXT" in e.message


@pytest.mark.parametrize("bad", [["1"], ["1", 0, 0], ["1", "zero"]])
def test_bad_link_shape(bad):
    g = good_graph()
    g["3"]["inputs"]["x"] = bad
    e = only_error(g)
    assert e.type == "bad_linked_input" and e.input_name == "x" and "node 3 (Sink)" in e.message


def test_link_to_missing_node_and_output_index():
    g = good_graph()
    g["3"]["inputs"]["x"] = ["9", 0]
    e = only_error(g)
    assert e.type == "bad_linked_input" and "node 9" in e.message and "'x'" in e.message
    g = good_graph()
    g["3"]["inputs"]["x"] = ["1", 3]
    e = only_error(g)
    assert e.type == "bad_linked_input" and "output 3" in e.message


def test_cycle_is_reported_on_every_node_of_it_with_one_path():
    g = {
        "1": {"class_type": "Sink", "inputs": {"x": ["2", 0], "y": ["2", 0]}},
        "2": {"class_type": "Sink", "inputs": {"x": ["1", 0], "y": ["1", 0]}},
    }
    errors = validate_graph(g, CLASSES)
    assert {e.node_id for e in errors} == {"1", "2"}
    assert all(e.type == "dependency_cycle" and "cycle" in e.message.lower() for e in errors)
    by_id = {e.node_id: e for e in errors}
    assert by_id["1"].message.endswith("1 <- 2 <- 1")  # the path, once, on the cycle's first node
    assert "<-" not in by_id["2"].message and "cycle of node 1" in by_id["2"].message


@pytest.mark.parametrize(
    "name,value,type_",
    [
        ("value", 11, "value_bigger_than_max"),
        ("value", -1, "value_smaller_than_min"),
        ("scale", 2.5, "value_bigger_than_max"),
        ("value", "three", "invalid_input_type"),
        ("value", 1.5, "invalid_input_type"),
        ("mode", "sub", "value_not_in_list"),
        ("label", 5, "invalid_input_type"),
        ("flag", "yes", "invalid_input_type"),
    ],
)
def test_widget_values_outside_their_range(name, value, type_):
    g = good_graph()
    g["1"]["inputs"][name] = value
    e = only_error(g)
    assert e.type == type_ and e.input_name == name
    assert f"'{name}'" in e.message and "node 1 (Source)" in e.message


def test_literal_for_a_link_only_input():
    g = good_graph()
    g["3"]["inputs"]["x"] = 5
    e = only_error(g)
    assert e.type == "invalid_input_type" and "must be a link to a NUMBER output" in e.message


def test_response_is_comfy_shaped_and_collects_every_error():
    g = good_graph()
    g["1"]["inputs"]["value"] = 99
    del g["3"]["inputs"]["y"]
    with pytest.raises(GraphValidationError) as info:
        check_graph(g, CLASSES)
    resp = info.value.response
    assert resp["error"]["type"] == "prompt_outputs_failed_validation"
    assert set(resp["node_errors"]) == {"1", "3"}
    entry = resp["node_errors"]["3"]
    assert entry["class_type"] == "Sink"
    assert entry["errors"][0]["extra_info"]["input_name"] == "y"
    text = format_errors(resp)
    assert "'value' of node 1 (Source)" in text and "'y' of node 3 (Sink)" in text


def test_graph_level_errors():
    with pytest.raises(GraphValidationError, match="non-empty"):
        validate_graph({}, CLASSES)
    with pytest.raises(GraphValidationError, match="no outputs"):
        validate_graph({"1": {"class_type": "Text", "inputs": {"text": "x"}}}, CLASSES)


def test_nothing_runs_when_validation_fails():
    ran = []

    class Recorder(Source):
        def run(self, **kw):
            ran.append(kw)
            return (1,)

    g = good_graph()
    g["3"]["inputs"]["y"] = ["7", 0]
    with pytest.raises(GraphValidationError):
        execute_graph(g, node_classes={**CLASSES, "Source": Recorder})
    assert ran == []


def test_topological_order_is_deterministic():
    g = {str(i): {"class_type": "Text", "inputs": {}} for i in (10, 2, 1)}
    order, cyclic = topological_order(g, set(g))
    assert order == ["1", "2", "10"] and cyclic == []


def test_nodes_downstream_of_a_cycle_are_not_reported_as_cyclic():
    g = good_graph()
    g["4"] = {"class_type": "Sink", "inputs": {"x": ["5", 0], "y": ["1", 0]}}
    g["5"] = {"class_type": "Sink", "inputs": {"x": ["4", 0], "y": ["2", 0]}}
    g["6"] = {"class_type": "Sink", "inputs": {"x": ["4", 0], "y": ["4", 0]}}  # uses the cycle, is not on it
    g["7"] = {"class_type": "Sink", "inputs": {"x": ["7", 0], "y": ["1", 0]}}  # a self-loop
    errors = validate_graph(g, CLASSES)
    assert {e.node_id for e in errors} == {"4", "5", "7"}
    by_id = {e.node_id: e for e in errors}
    assert "node 4 (Sink) depends on itself through its inputs: 4 <- 5 <- 4" in by_id["4"].message
    assert by_id["7"].message.endswith("7 <- 7")


def test_malformed_nodes_are_errors_not_tracebacks():
    g = good_graph()
    g["4"] = 5
    g["5"] = {"class_type": "Sink", "inputs": ["1", 0]}
    with pytest.raises(GraphValidationError) as info:
        execute_graph(g, node_classes=CLASSES)
    errors = info.value.response["node_errors"]
    assert set(errors) == {"4", "5"}
    assert "Node 4 has no class_type" in errors["4"]["errors"][0]["message"]
    assert "Node 5 (Sink): inputs must be an object" in errors["5"]["errors"][0]["message"]


def test_response_matches_comfyui_extra_info_details_and_dependent_outputs():
    g = good_graph()
    g["1"]["inputs"]["value"] = 99
    g["4"] = {"class_type": "Text", "inputs": {"text": "hi"}}
    g["3"]["inputs"]["y"] = ["4", 0]
    with pytest.raises(GraphValidationError) as info:
        check_graph(g, CLASSES)
    resp = info.value.response
    (too_big,) = resp["node_errors"]["1"]["errors"]
    assert too_big["extra_info"] == {"input_name": "value", "received_value": 99}
    assert too_big["details"] == "value"  # ComfyUI puts the input name there
    (mismatch,) = resp["node_errors"]["3"]["errors"]
    assert mismatch["extra_info"] == {"input_name": "y", "received_type": "TEXT", "linked_node": ["4", 0]}
    assert mismatch["details"] == "y, received_type(TEXT) mismatch input_type(NUMBER)"
    # the output nodes each failing node would have fed, as ComfyUI reports them
    assert resp["node_errors"]["1"]["dependent_outputs"] == ["3"]
    assert resp["node_errors"]["3"]["dependent_outputs"] == ["3"]
    # the top-level error lists every problem, one per line
    assert resp["error"]["details"].splitlines() == [too_big["message"] + ": value", mismatch["message"] + ": "
                                                     + mismatch["details"]]
    # the terminal form leaves out details that only repeat the message
    text = format_errors(resp)
    assert "received_type(TEXT)" not in text and "(value)" not in text


class Checked(Source):
    """A node with its own VALIDATE_INPUTS, which names only some inputs (as ComfyUI allows)."""

    @classmethod
    def VALIDATE_INPUTS(cls, value, mode):
        if mode == "mul" and value == 0:
            return "multiplying by 0 gives nothing"
        return True


class NeedsLinked(Sink):
    @classmethod
    def VALIDATE_INPUTS(cls, x):
        raise AssertionError("never called: 'x' is a link, known only at run time")


def test_custom_validate_inputs_gets_the_inputs_it_names():
    classes = {**CLASSES, "Checked": Checked, "NeedsLinked": NeedsLinked}
    g = good_graph()
    g["1"]["class_type"] = "Checked"
    g["3"]["class_type"] = "NeedsLinked"
    assert validate_graph(g, classes) == []
    g["1"]["inputs"].update({"value": 0, "mode": "mul"})
    e = only_error_of(g, classes)
    assert e.type == "custom_validation_failed" and e.node_id == "1"
    assert e.message == "Custom validation failed for node 1 (Checked): multiplying by 0 gives nothing"


def only_error_of(graph, classes):
    errors = validate_graph(graph, classes)
    assert len(errors) == 1, errors
    return errors[0]


# --- issue 9: validation is linear, and an answer stays small -------------------------------------


def ring(n: int, class_type: str = "XPUTrainingLoop") -> dict:
    """The probe's hang: node i takes model=[i-1, 0], node 0 takes model=[n-1, 0]."""
    g = {str(i): {"class_type": class_type, "inputs": {"model": [str(i - 1), 0]}} for i in range(n)}
    g["0"]["inputs"]["model"] = [str(n - 1), 0]
    return g


def test_a_9995_node_cycle_is_one_path_and_a_capped_answer():
    from xpufleet.constants import MAX_CYCLE_PATH_SHOWN, MAX_GRAPH_ERRORS_LISTED

    g = ring(9995)
    with pytest.raises(GraphValidationError) as info:
        check_graph(g)
    resp = info.value.response
    errors = [e for entry in resp["node_errors"].values() for e in entry["errors"]]
    assert len(errors) == MAX_GRAPH_ERRORS_LISTED  # the cap: 9,995 nodes miss inputs, all are on the cycle
    info_ = resp["error"]["extra_info"]
    # every TrainingLoop misses 7 required inputs, and each of the 9,995 is on the cycle
    assert info_["errors_total"] == 9995 * 7 + 9995 and info_["errors_listed"] == MAX_GRAPH_ERRORS_LISTED
    assert "more problem(s) not listed" in resp["error"]["details"] and "more problem(s) not listed" in format_errors(resp)
    assert len(json.dumps(resp)) < 100_000  # was 49 MB for 1,000 nodes: the answer no longer grows with the square
    # The cycle itself (all problems listed): one search, one path, on its first node, cut to its ends.
    everything = validate_report(g, max_errors=10**6).errors
    cycle = [e for e in everything if e.type == "dependency_cycle"]
    assert len(everything) == everything.total == 9995 * 8 and len(cycle) == 9995
    first = cycle[0]
    assert first.node_id == "0" and first.message.startswith("Dependency cycle detected: node 0 (XPUTrainingLoop)")
    assert first.message.count(" <- ") == MAX_CYCLE_PATH_SHOWN and first.extra == {"cycle_nodes": 9995}
    assert ": 0 <- 9994 <- 9993" in first.message and "(9976 more nodes)" in first.message
    assert first.message.endswith("<- 1 <- 0 (9995 nodes on the cycle)")
    assert all("<-" not in e.message and e.extra == {"cycle_of": "0"} for e in cycle[1:])


def test_a_graph_of_10000_nodes_without_an_output_is_one_graph_level_error():
    g = {str(i): {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}} for i in range(10_000)}
    with pytest.raises(GraphValidationError) as info:
        validate_graph(g)
    assert info.value.response["error"]["type"] == "prompt_no_outputs" and info.value.response["node_errors"] == {}


def test_many_failing_nodes_are_counted_and_their_dependents_capped():
    from xpufleet.constants import MAX_DEPENDENT_OUTPUTS_LISTED

    g = {"1": {"class_type": "Source", "inputs": {"value": 99, "scale": 1.0, "mode": "add"}}}
    for i in range(2, 300):  # 298 sinks, each an output that needs node 1; each also misses 'y'
        g[str(i)] = {"class_type": "Sink", "inputs": {"x": ["1", 0]}}
    with pytest.raises(GraphValidationError) as info:
        check_graph(g, CLASSES)
    resp = info.value.response
    assert resp["error"]["extra_info"] == {"errors_total": 299, "errors_listed": 100}
    assert len(resp["node_errors"]) == 100 and list(resp["node_errors"])[:3] == ["1", "2", "3"]
    assert resp["node_errors"]["1"]["dependent_outputs"] == [str(i) for i in range(2, 2 + MAX_DEPENDENT_OUTPUTS_LISTED)]
    assert resp["node_errors"]["7"]["dependent_outputs"] == ["7"]


def test_huge_and_unicode_digit_ids_sort_without_int():
    ids = ["10", "9", "0009", "²", "x", "1" * 5000, "2"]
    g = {n: {"class_type": "Text", "inputs": {"text": "t"}} for n in ids}
    order, stuck = topological_order(g, set(g))
    assert order == ["2", "0009", "9", "10", "1" * 5000, "x", "²"] and stuck == []


def test_received_values_are_cut_in_messages():
    g = good_graph()
    g["1"]["inputs"]["mode"] = "m" * 100_000
    e = only_error(g)
    assert e.type == "value_not_in_list" and len(e.message) < 400 and "(100002 characters)" in e.message
    assert isinstance(e.extra["received_value"], str) and len(e.extra["received_value"]) < 300


