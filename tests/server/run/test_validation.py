"""Graph validation as a property (server/run/validation.py): on any graph Hypothesis can build, from
well-formed to nonsense, with the real node classes, validation answers with node errors or a
graph-level GraphValidationError and never raises anything else; the answer is bounded and JSON."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xpufleet.constants import MAX_GRAPH_ERRORS_LISTED
from xpufleet.nodes import NODE_CLASS_MAPPINGS
from xpufleet.server.run.validation import ErrorList, GraphValidationError, NodeError, validate_report

CLASS_NAMES = sorted(NODE_CLASS_MAPPINGS)
IDS = [str(i) for i in range(8)] + ["x", "007", "²", "-1", ""]

scalars = (st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True)
           | st.text(max_size=12) | st.sampled_from(["auto", "cpu", "cuda:0", "iris", "adam", "fp32", "single",
                                                     "relu", "16,8", "models/m.pt", "../x.pt", "/abs.pt"]))
links = st.tuples(st.sampled_from(IDS) | st.integers(-2, 9), st.integers(-2, 12)).map(list)
values = st.recursive(scalars | links, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=4), inner, max_size=3), max_leaves=6)


@st.composite
def input_dicts(draw):
    """Inputs named as the class names them (mostly), with random values and links."""
    names = ["model", "dataloader", "optimizer", "loss", "epochs", "dataset", "name", "filename", "device",
             "batch_size", "checkpoint_dir", "hidden", "dataset_info", "lr", "path", "x"]
    return draw(st.dictionaries(st.sampled_from(names) | st.text(max_size=5), values, max_size=6))


nodes = st.one_of(
    st.fixed_dictionaries({"class_type": st.sampled_from(CLASS_NAMES), "inputs": input_dicts()}),
    st.fixed_dictionaries({"class_type": st.sampled_from(CLASS_NAMES) | st.text(max_size=6) | st.integers()}),
    st.fixed_dictionaries({"class_type": st.sampled_from(CLASS_NAMES), "inputs": values}),
    values,
)
graphs = st.dictionaries(st.sampled_from(IDS), nodes, max_size=8) | values


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(graphs)
def test_validation_never_raises_anything_but_its_documented_error(graph):
    try:
        report = validate_report(graph)
    except GraphValidationError as exc:  # the graph as a whole: not an object, empty, no output node
        assert exc.response["error"]["type"] in ("invalid_prompt", "prompt_no_outputs")
        json.dumps(exc.response)
        return
    assert isinstance(report.errors, ErrorList) and all(isinstance(e, NodeError) for e in report.errors)
    assert len(report.errors) <= MAX_GRAPH_ERRORS_LISTED and report.errors.total >= len(report.errors)
    if report.errors:
        try:
            report.raise_if_invalid()
        except GraphValidationError as exc:
            text = json.dumps(exc.response)  # JSON-able, whatever the graph held
            assert set(exc.response["node_errors"]) == {e.node_id for e in report.errors}
            assert len(text) < 100 * 1000
        else:
            raise AssertionError("errors but no GraphValidationError")


def test_a_large_invalid_graph_has_a_bounded_answer():
    graph = {str(i): {"class_type": "XPUTrainingLoop", "inputs": {"epochs": "x" * 1000}} for i in range(2000)}
    report = validate_report(graph)
    assert report.errors.total == 2000 * 8  # 7 required inputs missing + a bad epochs value, per node
    assert len(report.errors) == MAX_GRAPH_ERRORS_LISTED
    try:
        report.raise_if_invalid()
    except GraphValidationError as exc:
        assert len(json.dumps(exc.response)) < 100 * 1000
