"""A ComfyUI workflow against what one provider's ComfyUI offers (its reading, reading.py): the one place
the door's refusals of a ComfyUI run are decided and worded (docs/comfyui.md). Unknown node classes,
missing model files, and ComfyUI's own validation of the prompt (required inputs, COMBO values, links to
missing nodes or outputs, a link's type against the input's): each problem a sentence naming the provider,
the node (id and class), the input, the file and folder, and what to do. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..scheduling import ProviderInfo, RunTarget
from .needs import graph_needs, is_link, looks_like_model_file, nodes_of
from .reading import STATE_FAILED, STATE_PROBING, STATE_READY, ClassSpec, InputSpec, Reading, norm_file

OK, WAIT, NO = "ok", "wait", "no"
_SHOWN_OPTIONS = 8  # a COMBO refusal lists at most this many of the values offered
_ANY = "*"
_LITERAL_TYPES = frozenset({"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"})


@dataclass(frozen=True)
class Where:
    """Who a refusal names: ``worker gpu-box`` or ``this server``."""

    name: str
    is_local: bool = False

    @property
    def label(self) -> str:
        return "this server" if self.is_local else f"worker {self.name}"

    @property
    def restart(self) -> str:
        return "restart the sidecar" if self.is_local else "restart its agent"

    @property
    def comfyui(self) -> str:
        return "this server's ComfyUI" if self.is_local else "that worker's ComfyUI"


def no_comfyui(where: Where) -> str:
    """The refusal for a provider with no ComfyUI at all."""
    if where.is_local:
        return ("this server has no ComfyUI to run workflows: start the sidecar with --comfyui PATH, or queue "
                "to a worker started with --comfyui")
    return f"worker {where.name} has no ComfyUI to run workflows: start its agent with --comfyui PATH (the ComfyUI folder)"


def probing(where: Where) -> str:
    """Why a run waits for a provider still reading its ComfyUI."""
    return f"{where.label} is still reading its ComfyUI; the run waits until it has"


def unreadable(where: Where, error: str | None) -> str:
    """The refusal for a provider whose ComfyUI could not be read."""
    why = f" ({error})" if error else ""
    return (f"{where.label} could not read its ComfyUI{why}: fix it and {where.restart}, or choose another "
            f"target")


def _node(nid: str, ct: str) -> str:
    return f"node {nid}, {ct}"


def _types(t: str) -> set[str]:
    return {p.strip() for p in t.split(",") if p.strip()}


def types_match(output: str, wanted: str) -> bool:
    """ComfyUI's rule for a link: equal types, ``*`` on either side, or comma-separated unions that share
    a type (a COMBO fed by a node's list output is left to ComfyUI)."""
    if _ANY in (output, wanted) or "COMBO" in (output, wanted):
        return True
    return bool(_types(output) & _types(wanted))


def _shown(options: tuple[Any, ...]) -> str:
    shown = ", ".join(repr(o) for o in options[:_SHOWN_OPTIONS])
    more = len(options) - _SHOWN_OPTIONS
    return shown + (f" and {more} more" if more > 0 else "") if shown else "none"


def _check_links(where: Where, graph: Mapping[str, Any], reading: Reading, nid: str, ct: str,
                 name: str, value: Any, spec: InputSpec | None) -> list[str]:
    src_id = str(value[0])
    src = graph.get(src_id)
    if not isinstance(src, Mapping) or not isinstance(src.get("class_type"), str):
        return [f"{where.label}: node {nid} ({ct}) input '{name}' links to node {src_id}, which is not in the "
                f"workflow: connect it to a node that is"]
    src_ct = src["class_type"]
    src_spec = reading.classes.get(src_ct)
    if src_spec is None or spec is None:
        return []  # the unknown class is its own problem
    index = value[1]
    if not 0 <= index < len(src_spec.outputs):
        return [f"{where.label}: node {nid} ({ct}) input '{name}' links to output {index} of node {src_id} "
                f"({src_ct}), which has {len(src_spec.outputs)} outputs: connect an output it has"]
    out_type = src_spec.outputs[index]
    if not types_match(out_type, spec.type):
        return [f"{where.label}: node {nid} ({ct}) input '{name}' takes {spec.type}, but output {index} of node "
                f"{src_id} ({src_ct}) is {out_type}: connect an output of type {spec.type}"]
    return []


def _check_literal(where: Where, reading: Reading, nid: str, ct: str, name: str, value: Any,
                   spec: InputSpec) -> list[str]:
    if spec.options is None or value in spec.options:
        return []
    if isinstance(value, str) and norm_file(value) in {norm_file(o) for o in spec.options if isinstance(o, str)}:
        return []
    if looks_like_model_file(name, value):
        folders = [f for f, files in reading.models.items() if files & {norm_file(o) for o in spec.options
                                                                         if isinstance(o, str)}]
        place = f" in models/{folders[0]}" if len(folders) == 1 else ""
        return [f"{where.label} has no model file '{value}'{place} ({_node(nid, ct)}.{name}): put it there, "
                f"or choose another target"]
    return [f"{where.label}: node {nid} ({ct}) input '{name}' is {value!r}, which {where.comfyui} does not "
            f"offer (it offers {_shown(spec.options)}): choose one of those, or another target"]


def _check_node(where: Where, graph: Mapping[str, Any], reading: Reading, nid: str, ct: str,
                inputs: Mapping[str, Any], spec: ClassSpec, files: frozenset[str]) -> list[str]:
    """``files``: this node's inputs already checked as model files of a known folder."""
    out: list[str] = []
    for name, declared in spec.inputs.items():
        if declared.required and name not in inputs:
            out.append(f"{where.label}: node {nid} ({ct}) lacks the required input '{name}' ({declared.type}): "
                       f"set or connect it in the workflow")
    for name, value in inputs.items():
        ispec = spec.inputs.get(name)
        if is_link(value):
            out += _check_links(where, graph, reading, nid, ct, name, value, ispec)
        elif ispec is not None and name not in files:
            out += _check_literal(where, reading, nid, ct, name, value, ispec)
    return out


def problems(graph: Mapping[str, Any], reading: Reading, where: Where) -> list[str]:
    """Every reason ``where``'s ComfyUI (``reading``, read) cannot run ``graph``; [] when it can."""
    out: list[str] = []
    for nid, ct, _ in nodes_of(graph):
        if ct not in reading.classes:
            out.append(f"{where.label} has no node class '{ct}' (node {nid}): install the custom node that "
                       f"provides it in {where.comfyui} (custom_nodes/) and {where.restart}, or choose another "
                       f"target")
    needs = graph_needs(graph)
    # a loader outside the table, or whose folders the reading does not list: its COMBO options decide (below)
    listed = [n for n in needs.models if any(f in reading.models for f in n.folders)]
    for need in listed:
        if not any(reading.has_file(f, need.file) for f in need.folders):
            out.append(f"{where.label} has no model file '{need.file}' in models/{need.folders[0]} "
                       f"({_node(need.node, need.class_type)}.{need.input}): put it there, or choose another "
                       f"target")
    # a loader's file is said once, with its folder (above), not again as a COMBO value
    checked = {(n.node, n.input) for n in listed}
    for nid, ct, inputs in nodes_of(graph):
        spec = reading.classes.get(ct)
        if spec is not None:
            files = frozenset(i for (n, i) in checked if n == nid)
            out += _check_node(where, graph, reading, nid, ct, inputs, spec, files)
    return out


def verdict(where: Where, state: str, reading: Reading | None, graph: Mapping[str, Any]) -> tuple[str, str]:
    """Whether ``where`` can run ``graph`` now: ``(ok, "")``, ``(wait, why)`` while it reads its ComfyUI, or
    ``(no, the refusal)`` (its problems joined by ``; ``)."""
    if state == STATE_PROBING:
        return WAIT, probing(where)
    if state == STATE_FAILED:
        return NO, unreadable(where, reading.error if reading is not None else None)
    if state != STATE_READY or reading is None:
        return NO, no_comfyui(where)
    found = problems(graph, reading, where)
    return (NO, "; ".join(found)) if found else (OK, "")


def provider_verdict(p: ProviderInfo, t: RunTarget) -> tuple[str, str]:
    """:func:`verdict` for the routing's view of a provider and a ComfyUI run's target (the check
    ``resolve_target`` is given: scheduling cannot import this module)."""
    reading = p.comfyui_reading if isinstance(p.comfyui_reading, Reading) else None
    return verdict(Where(p.name, p.is_local), p.comfyui, reading, t.workflow or {})
