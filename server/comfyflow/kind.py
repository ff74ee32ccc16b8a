"""Which queued graphs are ComfyUI runs (the one rule): a graph holding any node class other than the
fleet's own (``nodes/__init__.py``) runs in a ComfyUI on the card it is given; a graph of fleet nodes only
runs in the fleet's own executor (server/run/executor.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...constants import RUN_KIND_COMFYUI, RUN_KIND_GRAPH
from ...nodes import NODE_CLASS_MAPPINGS

FLEET_CLASSES: frozenset[str] = frozenset(NODE_CLASS_MAPPINGS)


def foreign_classes(graph: Mapping[str, Any]) -> list[str]:
    """The node classes of ``graph`` (API prompt format) that are not the fleet's own, sorted."""
    found = set()
    for node in graph.values():
        if isinstance(node, Mapping):
            ct = node.get("class_type")
            if isinstance(ct, str) and ct not in FLEET_CLASSES:
                found.add(ct)
    return sorted(found)


def run_kind(graph: Mapping[str, Any]) -> str:
    """``comfyui`` for a graph with any node the fleet does not define, else ``graph``."""
    return RUN_KIND_COMFYUI if foreign_classes(graph) else RUN_KIND_GRAPH


def is_workflow(graph: Mapping[str, Any]) -> bool:
    """True when ``graph`` is a ComfyUI run (see :func:`run_kind`)."""
    return run_kind(graph) == RUN_KIND_COMFYUI
