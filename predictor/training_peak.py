"""The peak of a training graph for the capsule, and the plain sentence that opens its tooltip.

A graph of the plugin's own nodes (TrainingLoop, Evaluate, Predict) loads no model file: what it puts on
the card is the static estimate of :mod:`xpufleet.predictor.estimate` (``estimate_graph``), the same
figure the Queue on... dialog suggests (``POST /api/estimates``). The capsule's ``M_peak`` is that
figure, so both places show one number (docs/canvas.md, "The capsule for a training graph").
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Mapping
from threading import Lock
from typing import Any

from ..nodes import types as T
from .scan import WorkflowFormatError, detect_format

# The nodes that put a model on the card (the estimator's "uses").
TRAINING_NODES = frozenset({T.TRAINING_LOOP_NODE, T.EVALUATE_NODE, T.PREDICT_NODE})
_CACHE_SIZE = 32  # the capsule re-asks every few seconds with the same graph: build its models once
_cache: OrderedDict[str, Any] = OrderedDict()
_lock = Lock()


def api_graph(workflow: Any, prompt: Any) -> Mapping[str, Any] | None:
    """The API-format graph to estimate: ``prompt`` when given, else ``workflow`` when it is API format.

    Raises ValueError when ``prompt`` is given but is no API-format graph."""
    if prompt is not None:
        try:
            kind, graph = detect_format(prompt)
        except WorkflowFormatError as exc:
            raise ValueError(f"prompt: {exc}") from None
        if kind != "api":
            raise ValueError("prompt must be the API-format graph (node id -> {class_type, inputs})")
        return graph
    try:
        kind, graph = detect_format(workflow)
    except WorkflowFormatError:
        return None
    return graph if kind == "api" else None


def is_training_graph(graph: Mapping[str, Any] | None) -> bool:
    """Whether ``graph`` has a node that puts a model on the card."""
    return bool(graph) and any(isinstance(n, Mapping) and n.get("class_type") in TRAINING_NODES
                               for n in graph.values())


def training_estimate(graph: Mapping[str, Any]) -> dict[str, Any]:
    """``estimate_graph(graph)`` as JSON (``total_gib`` None when there is no estimate), cached by graph."""
    key = json.dumps(graph, sort_keys=True, default=str)
    with _lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    from .estimate import estimate_graph

    est = estimate_graph(graph)
    out = {"total_gib": est.total_gib, "rough": est.rough, "items": [i.to_json() for i in est.items],
           "reasons": list(est.reasons)}
    with _lock:
        _cache[key] = out
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return out


def summary(answer: Mapping[str, Any], snapshot: Any, peak_source: str) -> dict[str, Any]:
    """The fields of the tooltip's first sentence ("Fits: needs about 0.13 GiB of 24 GiB on gpu-box
    cuda:0 (simulated)"); the front end words it in the user's language.

    ``verdict``: ``fits`` (the peak fits in the usable VRAM), ``spills`` (part of it goes to RAM, the run
    can still succeed) or ``fails`` (predicted to fail). ``of_gb`` is the card's total VRAM, or the free
    RAM (``memory`` "ram") on a CPU."""
    ex = answer["explanation"]
    d_peak = float(ex["intermediates"].get("d_peak_gb") or 0.0)
    verdict = "fits" if d_peak <= 1e-9 else ("spills" if answer["p_success"] > 0 else "fails")
    on_card = snapshot.kind != "cpu" and snapshot.vram_total_gb > 0
    return {"verdict": verdict, "need_gb": ex["inputs"]["m_peak_gb"],
            "of_gb": snapshot.vram_total_gb if on_card else snapshot.ram_free_gb,
            "memory": "vram" if on_card else "ram", "peak_source": peak_source,
            "worker": snapshot.worker, "device": snapshot.device, "name": snapshot.name,
            "simulated": snapshot.simulated}


__all__ = ["TRAINING_NODES", "api_graph", "is_training_graph", "summary", "training_estimate"]
