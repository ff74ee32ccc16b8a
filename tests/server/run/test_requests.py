"""``POST /api/runs`` bodies (server/sidecar/requests.py): the limits of constants.py, each refused
with a 400 (413 for the node count) that names the field and states the limit."""

from __future__ import annotations

import pytest

from xpufleet.common.errors import RequestError
from xpufleet.constants import (
    MAX_FIELD_NAME_CHARS,
    MAX_GRAPH_NODES,
    MAX_GRAPH_STRING_CHARS,
    MAX_NODE_ID_CHARS,
    MAX_RUN_NAME_CHARS,
)
from xpufleet.server.run.requests import parse_run_request

LOSS = {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}}


def refused(body) -> RequestError:
    with pytest.raises(RequestError) as info:
        parse_run_request(body)
    return info.value


def test_graph_size_is_limited_with_413():
    ok = parse_run_request({"graph": {str(i): LOSS for i in range(MAX_GRAPH_NODES)}})
    assert len(ok.graph) == MAX_GRAPH_NODES
    e = refused({"graph": {str(i): LOSS for i in range(MAX_GRAPH_NODES + 1)}})
    assert e.status == 413 and e.message == f"graph: {MAX_GRAPH_NODES + 1} nodes; a graph has at most 10000 (the limit)"


@pytest.mark.parametrize("graph,fragment", [
    ({"9" * (MAX_NODE_ID_CHARS + 1): LOSS}, f"has {MAX_NODE_ID_CHARS + 1} characters; at most {MAX_NODE_ID_CHARS}"),
    ({"1": {"class_type": "X" * (MAX_FIELD_NAME_CHARS + 1)}}, f"graph['1'].class_type: {MAX_FIELD_NAME_CHARS + 1} characters"),
    ({"1": {"class_type": "XPULoss", "inputs": {"n" * 5000: 1}}}, "an input name of 5000 characters"),
    ({"1": {"class_type": "XPULoss", "k" * 5000: 1}}, "a field name of 5000 characters"),
    ({"1": {"class_type": "XPULoss", "inputs": {"name": "x" * (MAX_GRAPH_STRING_CHARS + 1)}}},
     f"graph['1'].inputs.name: a string of {MAX_GRAPH_STRING_CHARS + 1} characters; at most {MAX_GRAPH_STRING_CHARS}"),
    ({"1": {"class_type": "XPULoss", "inputs": {"name": [["y" * (MAX_GRAPH_STRING_CHARS + 1)]]}}}, "a string of"),
    # what looks like a link ([id, index]) or a plain float takes a fast path: it still checks the same
    ({"1": {"class_type": "XPULoss", "inputs": {"m": ["z" * (MAX_GRAPH_STRING_CHARS + 1), 0]}}}, "a string of"),
    ({"1": {"class_type": "XPULoss", "inputs": {"lr": float("nan")}}}, "graph['1'].inputs.lr: holds NaN or Infinity"),
    ({"1": {"class_type": "XPULoss", "inputs": {"lr": float("-inf")}}}, "holds NaN or Infinity"),
])
def test_ids_names_and_strings_are_limited(graph, fragment):
    e = refused({"graph": graph})
    assert e.status == 400 and fragment in e.message and len(e.message) < 300


def test_an_over_long_run_name_is_refused_not_cut():
    e = refused({"graph": {"1": LOSS}, "options": {"name": "n" * 5000}})
    assert e.status == 400 and e.message == f"options.name: 5000 characters; at most {MAX_RUN_NAME_CHARS}"
    assert parse_run_request({"graph": {"1": LOSS}, "options": {"name": " n "}}).name == "n"
