"""What a ComfyUI workflow (API prompt format) needs of the ComfyUI that runs it: its node classes and the
model files its loaders read, per folder (the predictor's ``LOADERS`` table: input name -> folders). An
input of another class whose value names a model file (``*_name`` / a model extension) is a need too; its
folder is unknown, so the check finds it through that input's COMBO options. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...predictor.scan import LOADERS, MODEL_EXTENSIONS


@dataclass(frozen=True)
class ModelNeed:
    """One model file a node reads: ``folders`` empty when only its input's options can say where."""

    node: str
    class_type: str
    input: str
    file: str
    folders: tuple[str, ...]


@dataclass(frozen=True)
class Needs:
    """The node classes (sorted) and model files of a workflow."""

    classes: tuple[str, ...]
    models: tuple[ModelNeed, ...]


def is_link(value: Any) -> bool:
    """An API prompt link: ``[source node id, output index]``."""
    return (isinstance(value, list | tuple) and len(value) == 2 and isinstance(value[0], str | int)
            and not isinstance(value[0], bool) and isinstance(value[1], int) and not isinstance(value[1], bool))


def looks_like_model_file(name: str, value: Any) -> bool:
    """A literal that names a model file: a string with a model file's extension."""
    return isinstance(value, str) and value.lower().endswith(MODEL_EXTENSIONS)


def nodes_of(graph: Mapping[str, Any]) -> list[tuple[str, str, Mapping[str, Any]]]:
    """(node id, class_type, inputs) of each node, in id order (numeric ids numerically)."""
    out = []
    for nid, node in graph.items():
        if isinstance(node, Mapping) and isinstance(node.get("class_type"), str):
            inputs = node.get("inputs")
            out.append((str(nid), node["class_type"], inputs if isinstance(inputs, Mapping) else {}))
    return sorted(out, key=lambda t: (0, int(t[0]), "") if t[0].isdigit() else (1, 0, t[0]))


def graph_needs(graph: Mapping[str, Any]) -> Needs:
    """The classes and model files ``graph`` needs (a linked loader input is not a need: it is computed)."""
    classes: set[str] = set()
    models: list[ModelNeed] = []
    for nid, ct, inputs in nodes_of(graph):
        classes.add(ct)
        loader = {li.name: li.folders for li in LOADERS.get(ct, ())}
        for name, value in inputs.items():
            if is_link(value) or not isinstance(value, str):
                continue
            if name in loader:
                models.append(ModelNeed(nid, ct, name, value, loader[name]))
            elif looks_like_model_file(name, value):
                models.append(ModelNeed(nid, ct, name, value, ()))
    return Needs(tuple(sorted(classes)), tuple(models))
