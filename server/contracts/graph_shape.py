"""The size and shape of a graph in a body (``POST /api/runs``, a canvas run, a sweep's graph) within the
limits of constants.py (docs/limits.md), checked before any validation in one pass, without recursion."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...constants import MAX_FIELD_NAME_CHARS, MAX_GRAPH_NODES, MAX_GRAPH_STRING_CHARS, MAX_NODE_ID_CHARS
from .base import ContractError

_INF = float("inf")


def _short(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_graph_shape(graph: Any) -> None:
    """The graph's size and shape within the limits (constants.py), before any validation: at most
    ``MAX_GRAPH_NODES`` nodes (413 beyond), ids, class types and input names within their lengths,
    no string value longer than ``MAX_GRAPH_STRING_CHARS``. One pass over the graph, no recursion."""
    if not isinstance(graph, Mapping) or not graph:
        raise ContractError("graph: must be a non-empty object {\"<node id>\": {\"class_type\", \"inputs\"}}")
    if len(graph) > MAX_GRAPH_NODES:
        raise ContractError(f"graph: {len(graph)} nodes; a graph has at most {MAX_GRAPH_NODES} (the limit)",
                           status=413)
    for nid, node in graph.items():
        if len(nid) > MAX_NODE_ID_CHARS:
            raise ContractError(f"graph: node id {_short(nid)} has {len(nid)} characters; at most {MAX_NODE_ID_CHARS}")
        if not isinstance(node, Mapping):
            raise ContractError(f"graph[{nid!r}]: a node must be an object with class_type and inputs")
        for key in node:
            if len(key) > MAX_FIELD_NAME_CHARS:
                raise ContractError(f"graph[{nid!r}]: a field name of {len(key)} characters; at most "
                                   f"{MAX_FIELD_NAME_CHARS}")
        ct = node.get("class_type")
        if not isinstance(ct, str) or not ct:
            raise ContractError(f"graph[{nid!r}].class_type: missing or not a string")
        if len(ct) > MAX_FIELD_NAME_CHARS:
            raise ContractError(f"graph[{nid!r}].class_type: {len(ct)} characters; at most {MAX_FIELD_NAME_CHARS}")
        inputs = node.get("inputs", {})
        if not isinstance(inputs, Mapping):
            raise ContractError(f"graph[{nid!r}].inputs: must be an object")
        for name, value in inputs.items():
            if len(name) > MAX_FIELD_NAME_CHARS:
                raise ContractError(f"graph[{nid!r}].inputs: an input name of {len(name)} characters "
                                   f"({_short(name)}); at most {MAX_FIELD_NAME_CHARS}")
            kind = type(value)
            if kind is str:  # (most inputs: a literal, checked without the walk below)
                if len(value) <= MAX_GRAPH_STRING_CHARS:
                    continue
            elif kind is int or kind is bool or value is None:
                continue
            elif kind is float:
                if value == value and value not in (_INF, -_INF):
                    continue
            elif (kind is list and len(value) == 2 and type(value[0]) is str and type(value[1]) is int
                  and len(value[0]) <= MAX_GRAPH_STRING_CHARS):
                continue  # a link [node id, output index]: most of a large graph's non-literal inputs
            stack = [value]
            while stack:  # nested lists/objects of one input (their depth is bounded by the body's)
                item = stack.pop()
                if isinstance(item, str):
                    if len(item) > MAX_GRAPH_STRING_CHARS:
                        raise ContractError(f"graph[{nid!r}].inputs.{name}: a string of {len(item)} characters; "
                                           f"at most {MAX_GRAPH_STRING_CHARS}")
                elif isinstance(item, (list, tuple)):
                    stack.extend(item)
                elif isinstance(item, float):
                    if item != item or item in (_INF, -_INF):
                        raise ContractError(f"graph[{nid!r}].inputs.{name}: holds NaN or Infinity, which JSON "
                                           f"does not allow")
                elif isinstance(item, Mapping):
                    stack.extend(item.values())
                    stack.extend(item.keys())
