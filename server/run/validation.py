"""Graph validation before anything runs (docs/nodes.md), answered in ComfyUI's ``validate_prompt`` shape.

Checked per node: known class_type, required inputs present, link shape, link target exists and
produces the expected type, literal values within their widget's type/range/list, the class's own
``VALIDATE_INPUTS``; and for the graph: dependency cycles and at least one output node.

Linear in the graph: each node is checked once (a class's ``INPUT_TYPES`` and ``VALIDATE_INPUTS``
signature are read once per class), one cycle search covers the whole graph (one path per cycle),
and an answer lists at most ``MAX_GRAPH_ERRORS_LISTED`` problems (the rest are counted), so neither
the time nor the answer grows faster than the graph.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ...constants import (
    MAX_CYCLE_PATH_SHOWN,
    MAX_DEPENDENT_OUTPUTS_LISTED,
    MAX_GRAPH_ERRORS_LISTED,
)
from .graph import (
    cycles_of,
    dependency_map,
    dependent_outputs,
    is_link,
    output_nodes,
    strongly_connected,
)

# Widget types whose literal values are validated here; every other type is link-only.
_WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}
# Hidden inputs ComfyUI fills itself; never required from the graph.
HIDDEN_VALUES = {"UNIQUE_ID", "PROMPT", "EXTRA_PNGINFO", "DYNPROMPT"}
VALUE_SHOWN_CHARS = 200  # a received value longer than this (as repr) is shown cut


# --- errors -----------------------------------------------------------------------------------


@dataclass
class NodeError:
    """One problem with one node input, in ComfyUI's ``node_errors`` item shape."""

    node_id: str
    class_type: str
    type: str
    message: str
    details: str = ""
    input_name: str | None = None
    # ComfyUI's extra_info also carries the offending value and, for links, the linked node.
    extra: dict[str, Any] = field(default_factory=dict)

    def as_comfy(self) -> dict[str, Any]:
        """This error as one item of ComfyUI's ``node_errors[id]["errors"]`` list."""
        extra: dict[str, Any] = {}
        if self.input_name is not None:
            extra["input_name"] = self.input_name
        extra.update(self.extra)
        return {"type": self.type, "message": self.message, "details": self.details, "extra_info": extra}


class ErrorList(list):
    """The problems listed (at most ``cap``) and ``total``, how many were found in all."""

    def __init__(self, cap: int = MAX_GRAPH_ERRORS_LISTED) -> None:
        super().__init__()
        self.cap = cap
        self.total = 0

    def add(self, error: NodeError) -> None:
        self.total += 1
        if len(self) < self.cap:
            self.append(error)

    @property
    def full(self) -> bool:
        return len(self) >= self.cap

    @property
    def unlisted(self) -> int:
        return self.total - len(self)


class GraphValidationError(Exception):
    """The graph failed validation; ``response`` is ComfyUI-shaped (``error`` + ``node_errors``)."""

    def __init__(self, errors: list[NodeError], graph_error: dict[str, Any] | None = None,
                 dependents: Mapping[str, list[str]] | None = None) -> None:
        self.errors = errors
        self.response = validation_response(errors, graph_error, dependents)
        super().__init__(format_errors(self.response))


def validation_response(errors: list[NodeError], graph_error: dict[str, Any] | None = None,
                        dependents: Mapping[str, list[str]] | None = None) -> dict[str, Any]:
    """ComfyUI's answer shape: ``{"error": {...}, "node_errors": {id: {"errors", "dependent_outputs",
    "class_type"}}}``. ``dependents`` maps a node id to the output nodes that need it (see
    :func:`~.graph.dependent_outputs`); as in ComfyUI, the top-level ``details`` lists every problem
    listed. An :class:`ErrorList` that dropped problems says how many in ``extra_info``."""
    node_errors: dict[str, Any] = {}
    for e in errors:
        entry = node_errors.setdefault(
            e.node_id,
            {"errors": [], "dependent_outputs": list((dependents or {}).get(e.node_id, [])), "class_type": e.class_type},
        )
        entry["errors"].append(e.as_comfy())
    unlisted = getattr(errors, "unlisted", 0)
    lines = [f"{e.message}: {e.details}" if e.details else e.message for e in errors]
    if unlisted:
        lines.append(f"... and {unlisted} more problem(s) not listed (an answer lists at most "
                     f"{MAX_GRAPH_ERRORS_LISTED})")
    error = graph_error or {
        "type": "prompt_outputs_failed_validation",
        "message": "Prompt outputs failed validation",
        "details": "\n".join(lines),
        "extra_info": {"errors_total": getattr(errors, "total", len(errors)), "errors_listed": len(errors)}
        if unlisted else {},
    }
    return {"error": error, "node_errors": node_errors}


def _adds_to_message(err: Mapping[str, Any]) -> bool:
    # ComfyUI's `details` often repeats the input name or value the message already names; a terminal
    # line shows it only when it says something more (a hint).
    details = str(err.get("details") or "")
    name = str((err.get("extra_info") or {}).get("input_name") or "")
    if not details or details in str(err.get("message", "")):
        return False
    return not (name and (details == name or details.startswith(f"{name}, ")))


def format_errors(response: Mapping[str, Any]) -> str:
    """One line per problem, for a terminal or a run's error field."""
    error = response.get("error", {})
    lines = [str(error.get("message", "Graph failed validation"))]
    for entry in response.get("node_errors", {}).values():
        for err in entry["errors"]:
            lines.append(f"  - {err['message']}" + (f" ({err['details']})" if _adds_to_message(err) else ""))
    info = error.get("extra_info") or {}
    if info.get("errors_total", 0) > info.get("errors_listed", 0):
        lines.append(f"  ... and {info['errors_total'] - info['errors_listed']} more problem(s) not listed")
    return "\n".join(lines)


# --- node checks ------------------------------------------------------------------------------


def shown(value: Any) -> str:
    """``repr(value)``, cut to ``VALUE_SHOWN_CHARS`` (a message never grows with a huge value)."""
    text = repr(value)
    return text if len(text) <= VALUE_SHOWN_CHARS else text[:VALUE_SHOWN_CHARS] + f"... ({len(text)} characters)"


def cut(text: str) -> str:
    """``text`` cut to ``VALUE_SHOWN_CHARS`` (an id or name shown as it is)."""
    return text if len(text) <= VALUE_SHOWN_CHARS else text[:VALUE_SHOWN_CHARS] + f"... ({len(text)} characters)"


def _received(value: Any) -> Any:
    # The value itself in extra_info, as ComfyUI gives it, unless it is too large to echo back.
    text = repr(value)
    return value if len(text) <= VALUE_SHOWN_CHARS else shown(value)


def _looks_like_link(value: Any) -> bool:
    # A two-element list whose second item is numeric is meant as a link even when malformed.
    return isinstance(value, (list, tuple)) and (len(value) != 2 or not is_link(value)) and len(value) in (1, 2, 3)


def input_specs(cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    """(required, optional) input specs of a node class."""
    spec = cls.INPUT_TYPES()
    return dict(spec.get("required", {}) or {}), dict(spec.get("optional", {}) or {})


def _types_match(produced: str, expected: Any) -> bool:
    if isinstance(expected, (list, tuple)):  # a combo widget fed by a link: ComfyUI accepts it
        return True
    if produced == "*" or expected == "*" or produced == expected:
        return True
    want = {t.strip() for t in str(expected).split(",")}
    have = {t.strip() for t in str(produced).split(",")}
    return bool(want & have)


def _node_label(node_id: str, class_type: str) -> str:
    return f"node {node_id} ({class_type})"


def _check_widget(node_id: str, class_type: str, name: str, spec: Any, value: Any) -> list[NodeError]:
    """Validate a literal value against its widget spec (type, min/max, combo list)."""
    kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    opts = spec[1] if isinstance(spec, (list, tuple)) and len(spec) > 1 and isinstance(spec[1], dict) else {}
    where = f"input '{name}' of {_node_label(node_id, class_type)}"

    def err(type_: str, message: str, details: str = "") -> list[NodeError]:
        return [NodeError(node_id, class_type, type_, message, details or name, name, {"received_value": _received(value)})]

    if isinstance(kind, (list, tuple)):  # combo
        try:
            ok = value in kind
        except TypeError:  # an unhashable value against a set-like list
            ok = False
        if not ok:
            listed = ", ".join(map(str, list(kind)[:12])) + (", ..." if len(kind) > 12 else "")
            return err("value_not_in_list", f"Value not in list: {where}: {shown(value)} not in [{listed}]")
        return []
    if kind not in _WIDGET_TYPES:
        return err(
            "invalid_input_type",
            f"{where[0].upper() + where[1:]} must be a link to a {kind} output, got {shown(value)}",
            "write a link as [node_id, output_index]",
        )
    try:
        if kind == "INT":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            value = int(value)
        elif kind == "FLOAT":
            if isinstance(value, bool):
                raise ValueError
            value = float(value)
            if math.isnan(value):
                raise ValueError
        elif kind == "BOOLEAN":
            if not isinstance(value, bool):
                raise ValueError
        elif kind == "STRING":
            if not isinstance(value, str):
                raise ValueError
    except (TypeError, ValueError, OverflowError):
        return err("invalid_input_type", f"Failed to convert an input value to a {kind} value: {where}: {shown(value)}")
    if kind in ("INT", "FLOAT"):
        lo, hi = opts.get("min"), opts.get("max")
        if lo is not None and value < lo:
            return err("value_smaller_than_min", f"Value {value} smaller than min of {lo}: {where}")
        if hi is not None and value > hi:
            return err("value_bigger_than_max", f"Value {value} bigger than max of {hi}: {where}")
    return []


@dataclass
class _ClassInfo:
    """What validation reads from a node class, read once per class per validation."""

    fields: list[tuple[str, Any, Any, bool]]  # (name, spec, kind, required), hidden inputs left out
    return_types: list[str]
    validate: Any = None  # VALIDATE_INPUTS
    params: Mapping[str, inspect.Parameter] | None = None
    takes_any: bool = False  # VALIDATE_INPUTS(**kwargs)
    needs: tuple[str, ...] = ()  # the parameters it must be given


def _class_info(cls: type) -> _ClassInfo:
    required, optional = input_specs(cls)
    fields = []
    for specs, is_required in ((required, True), (optional, False)):
        for name, spec in specs.items():
            kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
            if not (isinstance(kind, str) and kind in HIDDEN_VALUES):
                fields.append((name, spec, kind, is_required))
    info = _ClassInfo(fields, list(getattr(cls, "RETURN_TYPES", ())))
    info.validate = getattr(cls, "VALIDATE_INPUTS", None)
    if info.validate is not None:
        try:
            params = info.params = inspect.signature(info.validate).parameters
        except (TypeError, ValueError):
            info.validate = None
        else:
            info.takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
            info.needs = tuple(n for n, p in params.items()
                               if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    return info


def _custom_validation(info: _ClassInfo, nid: str, ct: str, inputs: Mapping[str, Any]) -> NodeError | None:
    """A class's own ``VALIDATE_INPUTS``, called (as ComfyUI does) with the inputs its signature names."""
    if info.validate is None or info.params is None:
        return None
    params = info.params
    if info.takes_any:
        literal = {k: v for k, v in inputs.items() if not is_link(v)}
    else:
        literal = {k: inputs[k] for k in params if k in inputs and not is_link(inputs[k])}
        if any(n not in literal for n in info.needs):
            return None  # it asks for a linked input, whose value exists only at run time
    try:
        verdict = info.validate(**literal)
    except Exception as exc:  # noqa: BLE001 - the node's own check failed: report it, never a traceback
        verdict = f"{type(exc).__name__}: {exc}"
    if verdict is True:
        return None
    reason = "" if verdict is False else str(verdict)
    name = next(iter(literal)) if len(literal) == 1 else None
    label = _node_label(nid, ct)
    return NodeError(nid, ct, "custom_validation_failed",
                     f"Custom validation failed for {label}" + (f": {reason}" if reason else ""),
                     f"{name} - {reason}" if name and reason else reason, name)


def _cycle_text(path: tuple[str, ...]) -> str:
    """``a <- b <- a``; a long path shows its ends and how many nodes lie between."""
    if len(path) <= MAX_CYCLE_PATH_SHOWN:
        return " <- ".join(path)
    head = MAX_CYCLE_PATH_SHOWN // 2
    tail = MAX_CYCLE_PATH_SHOWN - head
    hidden = len(path) - head - tail
    return " <- ".join(path[:head]) + f" <- ... ({hidden} more nodes) ... <- " + " <- ".join(path[-tail:])


# --- validation -------------------------------------------------------------------------------


def default_node_classes() -> dict[str, type]:
    from ...nodes import NODE_CLASS_MAPPINGS

    return dict(NODE_CLASS_MAPPINGS)


def _graph_error(type_: str, message: str) -> GraphValidationError:
    return GraphValidationError([], {"type": type_, "message": message, "details": "", "extra_info": {}})


@dataclass
class _Pass:
    """One validation pass: the class infos and the verdicts already reached (a widget value, a link
    type, a VALIDATE_INPUTS call: identical ones repeat across the nodes of a large graph)."""

    classes: Mapping[str, type]
    infos: dict[type, _ClassInfo] = field(default_factory=dict)
    ok: set[tuple[Any, ...]] = field(default_factory=set)

    def info(self, cls: type) -> _ClassInfo:
        found = self.infos.get(cls)
        if found is None:
            found = self.infos[cls] = _class_info(cls)
        return found


def _hashable(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


def _check_node(nid: str, node: Any, graph: Mapping[str, Any], run: _Pass, errors: ErrorList) -> None:
    if not isinstance(node, Mapping) or "class_type" not in node:
        errors.add(NodeError(nid, "", "invalid_prompt",
                             f"Node {nid} has no class_type: write {{\"class_type\": ..., \"inputs\": {{...}}}}"))
        return
    ct = node["class_type"]
    cls = run.classes.get(ct) if isinstance(ct, str) else None
    if cls is None:
        errors.add(NodeError(nid, str(ct), "invalid_prompt", f"Cannot execute because node {nid} has an unknown "
                             f"class_type {shown(ct)}: this node type does not exist"))
        return
    inputs = node.get("inputs", {})
    if not isinstance(inputs, Mapping):
        errors.add(NodeError(nid, ct, "invalid_prompt", f"Node {nid} ({ct}): inputs must be an object"))
        return
    info = run.info(cls)
    before = errors.total
    label = _node_label(nid, ct)
    for name, spec, kind, required in info.fields:
        if name not in inputs:
            if not required:
                continue
            if errors.full:
                errors.total += 1  # counted, not listed: no text to build
            else:
                errors.add(NodeError(nid, ct, "required_input_missing",
                                     f"Required input is missing: '{name}' of {label}", name, name))
            continue
        value = inputs[name]
        if is_link(value):
            _check_link(nid, ct, label, name, kind, value, graph, run, errors)
        elif _looks_like_link(value):
            errors.add(NodeError(nid, ct, "bad_linked_input", f"Bad linked input, must be a length-2 list of "
                                 f"[node_id, slot_index]: '{name}' of {label} is {shown(value)}",
                                 shown(value), name, {"received_value": _received(value)}))
        else:
            key = (cls, name, type(value), value) if _hashable(value) else None
            if key is not None and key in run.ok:
                continue
            found = _check_widget(nid, ct, name, spec, value)
            for e in found:
                errors.add(e)
            if not found and key is not None:
                run.ok.add(key)
    if errors.total == before:  # as in ComfyUI: only after the static checks pass
        literal = tuple((k, v) for k, v in inputs.items() if info.params and k in info.params and _hashable(v))
        key = (cls, "VALIDATE_INPUTS", literal)
        if info.validate is None or key in run.ok:
            return
        custom = _custom_validation(info, nid, ct, inputs)
        if custom is not None:
            errors.add(custom)
        elif not info.takes_any and len(literal) == sum(1 for k in info.params or () if k in inputs):
            run.ok.add(key)  # every input it was given is in the key: the same inputs pass again


def _check_link(nid: str, ct: str, label: str, name: str, kind: Any, value: Any, graph: Mapping[str, Any],
                run: _Pass, errors: ErrorList) -> None:
    src_id = str(value[0])
    src = graph.get(src_id)
    if src is None:
        errors.add(NodeError(nid, ct, "bad_linked_input", f"Bad linked input: '{name}' of {label} links to node "
                             f"{cut(src_id)}, which is not in the graph", shown(list(value)), name,
                             {"received_value": _received(list(value))}))
        return
    src_ct = src.get("class_type") if isinstance(src, Mapping) else None
    src_cls = run.classes.get(src_ct) if isinstance(src_ct, str) else None
    if src_cls is None:
        return  # reported on the source node itself
    idx = value[1]
    key = (src_cls, idx, kind if _hashable(kind) else repr(kind))
    if key in run.ok:
        return
    rtypes = run.info(src_cls).return_types
    if idx < 0 or idx >= len(rtypes):
        errors.add(NodeError(nid, ct, "bad_linked_input", f"Bad linked input: '{name}' of {label} links to output "
                             f"{shown(idx)} of node {src_id} ({src_ct}), which has {len(rtypes)} outputs",
                             shown(list(value)), name, {"received_value": _received(list(value))}))
        return
    if not _types_match(rtypes[idx], kind):
        errors.add(NodeError(nid, ct, "return_type_mismatch", f"Return type mismatch between linked nodes: '{name}' "
                             f"of {label} expects {kind} but node {src_id} ({src_ct}) output {idx} is {rtypes[idx]}",
                             f"{name}, received_type({rtypes[idx]}) mismatch input_type({kind})", name,
                             {"received_type": rtypes[idx], "linked_node": [src_id, idx]}))
        return
    run.ok.add(key)


@dataclass
class ValidationReport:
    """Everything one validation pass found: the problems (listed and counted) and, for the nodes
    listed, the output nodes that need them."""

    errors: ErrorList
    dependents: dict[str, list[str]]

    def raise_if_invalid(self) -> None:
        if self.errors:
            raise GraphValidationError(self.errors, None, self.dependents)


def validate_report(graph: Any, node_classes: Mapping[str, type] | None = None,
                    max_errors: int = MAX_GRAPH_ERRORS_LISTED) -> ValidationReport:
    """Validate ``graph`` (see the module docstring), listing at most ``max_errors`` problems.
    Problems of the graph as a whole (not an object, empty, no output node) raise
    :class:`GraphValidationError` directly, since no node can be named."""
    classes = node_classes if node_classes is not None else default_node_classes()
    if not isinstance(graph, Mapping) or not graph:
        raise _graph_error("invalid_prompt",
                           "Graph must be a non-empty JSON object of {node_id: {class_type, inputs}}")
    graph = {str(k): v for k, v in graph.items()}
    errors = ErrorList(max_errors)
    run = _Pass(classes)
    for nid, node in graph.items():
        _check_node(nid, node, graph, run, errors)
    # Every object node (one with malformed inputs has no links, so is on no cycle).
    deps = dependency_map(graph, [nid for nid, node in graph.items() if isinstance(node, Mapping)])
    components = strongly_connected(deps)
    for cycle in cycles_of(components, deps):
        first = cycle.path[0]
        ct = str(graph[first].get("class_type", ""))
        chain = _cycle_text(cycle.path)
        size = len(cycle.members)
        errors.add(NodeError(first, ct, "dependency_cycle",
                             f"Dependency cycle detected: {_node_label(first, ct)} depends on itself through its "
                             f"inputs: {chain}" + (f" ({size} nodes on the cycle)" if size > 2 else ""),
                             chain, None, {"cycle_nodes": size}))
        others = [m for m in cycle.members if m != first]
        for done, other in enumerate(others):
            if errors.full:  # the rest of the cycle is counted, not listed: no text to build
                errors.total += len(others) - done
                break
            oct_ = str(graph[other].get("class_type", ""))
            errors.add(NodeError(other, oct_, "dependency_cycle",
                                 f"Dependency cycle detected: {_node_label(other, oct_)} is on the dependency "
                                 f"cycle of node {first} (its path is listed on node {first})",
                                 f"on the cycle of node {first}", None, {"cycle_of": first}))
    if not errors and not output_nodes(graph, classes):
        raise _graph_error("prompt_no_outputs", "Prompt has no outputs: add an output node (e.g. TrainingLoop, "
                                                "Evaluate, ModelSaver, Predict)")
    dependents = dependent_outputs(graph, classes, only={e.node_id for e in errors},
                                   limit=MAX_DEPENDENT_OUTPUTS_LISTED, deps=deps, components=components) \
        if errors else {}
    return ValidationReport(errors, dependents)


def validate_graph(graph: Any, node_classes: Mapping[str, type] | None = None) -> list[NodeError]:
    """Every problem in ``graph``'s nodes (empty list = valid), at most ``MAX_GRAPH_ERRORS_LISTED``
    of them (an :class:`ErrorList`: ``total`` counts them all). Graph-level problems raise
    :class:`GraphValidationError`; see :func:`validate_report`."""
    return validate_report(graph, node_classes).errors


def check_graph(graph: Any, node_classes: Mapping[str, type] | None = None) -> None:
    """Raise :class:`GraphValidationError` unless ``graph`` is valid."""
    validate_report(graph, node_classes).raise_if_invalid()
