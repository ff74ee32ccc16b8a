"""A sweep spec -> its variants -> the ``POST /api/runs`` body of each child (pure).

Variants are numbered from 0 in a fixed order: points in grid order (the first parameter varies
slowest) or in the order a random sweep draws them, and within a point its seeds in the order given,
so the same spec always expands the same way.

Files: a graph's savers (ModelSaver) that write to the shared outputs folder are moved to each child's
own run folder (``location: run_dir``), so variants and trials never overwrite one another's model
(docs/sweeps.md). A sweep that sets or varies a saver's ``location`` itself keeps its choice.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .params import Param, apply_values, grid_values, probe_values, sample
from .spec import StudySpec, SweepSpec


@dataclass(frozen=True)
class Variant:
    """One child run: its parameter point, the values it sets (path -> value) and its seed."""

    index: int
    point: int
    values: dict[str, Any]
    seed: int | None


def points(spec: SweepSpec) -> list[dict[str, Any]]:
    """Every parameter point of the sweep (path -> value), in order."""
    if spec.mode == "random":
        rng = random.Random(spec.random_seed)
        return [{p.path: sample(p.domain, rng) for p in spec.params} for _ in range(int(spec.samples or 0))]
    columns = [grid_values(p.domain) for p in spec.params]
    paths = [p.path for p in spec.params]
    return [dict(zip(paths, combo, strict=True)) for combo in itertools.product(*columns)]


def variants(spec: SweepSpec) -> list[Variant]:
    """Every child of the sweep: each point once per seed (or once, without seeds)."""
    seeds: Sequence[int | None] = spec.seeds or (None,)
    out: list[Variant] = []
    for point, values in enumerate(points(spec)):
        for seed in seeds:
            out.append(Variant(len(out), point, values, seed))
    return out


def format_value(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def child_name(name: str, label: str, values: Mapping[str, Any], seed: int | None) -> str:
    """``digits-lr #2 5.lr=0.008 seed=1``: what the Runs panel shows for a child."""
    parts = [f"{name} {label}"] + [f"{k}={format_value(v)}" for k, v in values.items()]
    if seed is not None:
        parts.append(f"seed={seed}")
    return " ".join(parts)  # POST /api/runs' own cap on names applies


SAVER_CLASSES = ("XPUModelSaver",)  # nodes with a ``filename`` under a ``location`` (outputs | run_dir)
SHARED_LOCATION = "outputs"
OWN_LOCATION = "run_dir"


def param_labels(graph: Mapping[str, Any] | None, paths: Iterable[str]) -> dict[str, str]:
    """path -> "<node title> <input>" (``"5.lr"`` -> ``"Optimizer lr"``): the node's canvas title
    (``_meta.title``), else its class without the plugin's ``XPU`` prefix, as the New sweep picker names it."""
    out = {}
    for path in paths:
        node_id, _, name = path.rpartition(".")
        node = (graph or {}).get(node_id)
        if not isinstance(node, Mapping):
            out[path] = path
            continue
        meta = node.get("_meta")
        title = meta.get("title") if isinstance(meta, Mapping) and isinstance(meta.get("title"), str) else None
        out[path] = f"{title or str(node.get('class_type', node_id)).removeprefix('XPU')} {name}"
    return out


def shared_outputs(graph: Mapping[str, Any], explicit: Iterable[str] = ()) -> list[dict[str, Any]]:
    """The savers of ``graph`` that write to the shared outputs folder and whose ``location`` is not in
    ``explicit`` (paths a sweep sets or varies): ``[{node, class_type, title, filename}]``, in node order.
    A linked ``filename`` is reported as None (known only when the run saves)."""
    chosen = set(explicit)
    out = []
    for node_id, node in graph.items():
        if not isinstance(node, Mapping) or node.get("class_type") not in SAVER_CLASSES:
            continue
        inputs = node.get("inputs") or {}
        if f"{node_id}.location" in chosen or inputs.get("location", SHARED_LOCATION) != SHARED_LOCATION:
            continue
        filename = inputs.get("filename")
        meta = node.get("_meta")
        out.append({"node": node_id, "class_type": node["class_type"],
                    "title": meta.get("title") if isinstance(meta, Mapping) else None,
                    "filename": filename if isinstance(filename, str) else None})
    return out


def own_outputs(graph: dict[str, Any], explicit: Iterable[str] = ()) -> dict[str, Any]:
    """``graph`` with every saver :func:`shared_outputs` lists moved to the child's run folder (only those
    nodes are copied)."""
    moved = {f"{o['node']}.location": OWN_LOCATION for o in shared_outputs(graph, explicit)}
    return apply_values(graph, moved) if moved else graph


def child_body(graph: Mapping[str, Any], params: Sequence[Param], fixed: Mapping[str, Any],
               options: Mapping[str, Any], values: Mapping[str, Any], seed: int | None, name: str,
               ) -> dict[str, Any]:
    """The ``POST /api/runs`` body of one child: the base graph with ``fixed`` and ``values`` set and its
    savers moved to its own run folder (:func:`own_outputs`), the sweep's options (its target included)
    with the child's name and seed."""
    child_options = dict(options)
    child_options["name"] = name
    if seed is not None:
        child_options["seed"] = seed
    child = apply_values(graph, {**fixed, **values}, params)
    explicit = [*fixed, *(p.path for p in params), *values]
    return {"graph": own_outputs(child, explicit), "options": child_options}


def sweep_child(spec: SweepSpec, v: Variant) -> dict[str, Any]:
    return child_body(spec.graph, spec.params, spec.fixed, spec.options, v.values, v.seed,
                      child_name(spec.name, f"#{v.index}", v.values, v.seed))


def study_child(spec: StudySpec, number: int, values: Mapping[str, Any]) -> dict[str, Any]:
    return child_body(spec.graph, spec.params, spec.fixed, spec.options, values, None,
                      child_name(spec.name, f"trial {number}", values, None))


def probe_points(params: Sequence[Param], limit: int = 64) -> list[dict[str, Any]]:
    """The points a study's whole-batch check submits before any trial exists: every parameter at each
    of its probe values (a range's two ends, every listed value) with the others at their first one.
    At most ``limit`` points (the first ones; each is a full admission check)."""
    base = {p.path: probe_values(p.domain)[0] for p in params}
    out = [base]
    for p in params:
        for v in probe_values(p.domain)[1:]:
            if len(out) >= limit:
                return out
            out.append({**base, p.path: v})
    return out
