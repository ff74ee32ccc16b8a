"""The graph executor for ComfyUI API-format graphs (SPEC N1, N2).

A graph is ``{"<id>": {"class_type": ..., "inputs": {...}}}``; a link is ``[node_id, output_index]``.
The whole graph is validated before anything runs (:func:`validate_graph`); errors come back in the
shape ComfyUI's own ``validate_prompt`` answers with, never as a traceback. Execution is topological,
limited (as in ComfyUI) to the output nodes and what they depend on, and stops cooperatively between
nodes (and inside long nodes through ``nodes.runtime.should_stop``).
"""

from __future__ import annotations

import inspect
import math
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...nodes import runtime
from ...nodes.runtime import RunContext, RunStopped

# Widget types whose literal values are validated here; every other type is link-only.
_WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN"}
# Hidden inputs ComfyUI fills itself; never required from the graph.
_HIDDEN_VALUES = {"UNIQUE_ID", "PROMPT", "EXTRA_PNGINFO", "DYNPROMPT"}


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


class GraphValidationError(Exception):
    """The graph failed validation; ``response`` is ComfyUI-shaped (``error`` + ``node_errors``)."""

    def __init__(self, errors: list[NodeError], graph_error: dict[str, Any] | None = None,
                 dependents: Mapping[str, list[str]] | None = None) -> None:
        self.errors = errors
        self.response = validation_response(errors, graph_error, dependents)
        super().__init__(format_errors(self.response))


class NodeExecutionError(Exception):
    """A node raised while running; names the node and keeps the original exception."""

    def __init__(self, node_id: str, class_type: str, exc: BaseException) -> None:
        self.node_id = node_id
        self.class_type = class_type
        self.original = exc
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        super().__init__(f"Node {node_id} ({class_type}) failed: {type(exc).__name__}: {exc}")


def validation_response(errors: list[NodeError], graph_error: dict[str, Any] | None = None,
                        dependents: Mapping[str, list[str]] | None = None) -> dict[str, Any]:
    """ComfyUI's answer shape: ``{"error": {...}, "node_errors": {id: {"errors", "dependent_outputs",
    "class_type"}}}``. ``dependents`` maps a node id to the output nodes that need it (see
    :func:`dependent_outputs`); as in ComfyUI, the top-level ``details`` lists every problem."""
    node_errors: dict[str, Any] = {}
    for e in errors:
        entry = node_errors.setdefault(
            e.node_id,
            {"errors": [], "dependent_outputs": list((dependents or {}).get(e.node_id, [])), "class_type": e.class_type},
        )
        entry["errors"].append(e.as_comfy())
    error = graph_error or {
        "type": "prompt_outputs_failed_validation",
        "message": "Prompt outputs failed validation",
        "details": "\n".join(f"{e.message}: {e.details}" if e.details else e.message for e in errors),
        "extra_info": {},
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
    lines = [str(response.get("error", {}).get("message", "Graph failed validation"))]
    for entry in response.get("node_errors", {}).values():
        for err in entry["errors"]:
            lines.append(f"  - {err['message']}" + (f" ({err['details']})" if _adds_to_message(err) else ""))
    return "\n".join(lines)


# --- graph helpers ----------------------------------------------------------------------------


def is_link(value: Any) -> bool:
    """A link is ``[node_id, output_index]`` (a list or tuple of a string/int id and an int)."""
    return (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and isinstance(value[0], (str, int))
        and not isinstance(value[0], bool)
        and isinstance(value[1], int)
        and not isinstance(value[1], bool)
    )


def _looks_like_link(value: Any) -> bool:
    # A two-element list whose second item is numeric is meant as a link even when malformed.
    return isinstance(value, (list, tuple)) and (len(value) != 2 or not is_link(value)) and len(value) in (1, 2, 3)


def _input_specs(cls: type) -> tuple[dict[str, Any], dict[str, Any]]:
    spec = cls.INPUT_TYPES()
    return dict(spec.get("required", {}) or {}), dict(spec.get("optional", {}) or {})


def _types_match(produced: str, expected: Any) -> bool:
    if isinstance(expected, (list, tuple)):  # a combo widget fed by a link: ComfyUI accepts it
        return True
    if produced == "*" or expected == "*":
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
        return [NodeError(node_id, class_type, type_, message, details or name, name, {"received_value": value})]

    if isinstance(kind, (list, tuple)):  # combo
        if value not in kind:
            shown = ", ".join(map(str, list(kind)[:12])) + (", ..." if len(kind) > 12 else "")
            return err("value_not_in_list", f"Value not in list: {where}: {value!r} not in [{shown}]")
        return []
    if kind not in _WIDGET_TYPES:
        return err(
            "invalid_input_type",
            f"{where[0].upper() + where[1:]} must be a link to a {kind} output, got {value!r}",
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
    except (TypeError, ValueError):
        return err("invalid_input_type", f"Failed to convert an input value to a {kind} value: {where}: {value!r}")
    if kind in ("INT", "FLOAT"):
        lo, hi = opts.get("min"), opts.get("max")
        if lo is not None and value < lo:
            return err("value_smaller_than_min", f"Value {value} smaller than min of {lo}: {where}")
        if hi is not None and value > hi:
            return err("value_bigger_than_max", f"Value {value} bigger than max of {hi}: {where}")
    return []


def _coerce(spec: Any, value: Any) -> Any:
    kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    if kind == "INT":
        return int(value)
    if kind == "FLOAT":
        return float(value)
    return value


def output_nodes(graph: Mapping[str, Any], node_classes: Mapping[str, type]) -> list[str]:
    """Ids of nodes whose class is an OUTPUT_NODE."""
    return [
        nid
        for nid, node in graph.items()
        if isinstance(node, Mapping) and getattr(node_classes.get(node.get("class_type")), "OUTPUT_NODE", False)
    ]


def _upstream(graph: Mapping[str, Any], roots: list[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(roots)
    while stack:
        nid = stack.pop()
        if nid in seen or nid not in graph or not isinstance(graph[nid], Mapping):
            continue
        seen.add(nid)
        for v in _inputs(graph[nid]).values():
            if is_link(v):
                stack.append(str(v[0]))
    return seen


def topological_order(graph: Mapping[str, Any], nodes: set[str]) -> tuple[list[str], list[str]]:
    """Kahn's algorithm over ``nodes``; returns (order, nodes that cannot be ordered: those on a
    dependency cycle and those downstream of one). Ties break by id."""

    def key(n: str) -> tuple[int, Any]:
        return (0, int(n)) if n.isdigit() else (1, n)

    deps = {n: {str(v[0]) for v in _inputs(graph[n]).values() if is_link(v)} & nodes for n in nodes}
    users: dict[str, set[str]] = {n: set() for n in nodes}
    for n, ds in deps.items():
        for d in ds:
            users[d].add(n)
    ready = sorted((n for n, ds in deps.items() if not ds), key=key)
    order: list[str] = []
    remaining = {n: len(ds) for n, ds in deps.items()}
    while ready:
        n = ready.pop(0)
        order.append(n)
        for u in sorted(users[n], key=key):
            remaining[u] -= 1
            if remaining[u] == 0:
                ready.append(u)
        ready.sort(key=key)
    cyclic = sorted((n for n, c in remaining.items() if c > 0), key=key)
    return order, cyclic


def _inputs(node: Any) -> Mapping[str, Any]:
    """A node's inputs, or nothing for a malformed node (reported by validation, skipped here)."""
    inputs = node.get("inputs") if isinstance(node, Mapping) else None
    return inputs if isinstance(inputs, Mapping) else {}


def _deps(graph: Mapping[str, Any], nid: str) -> set[str]:
    return {str(v[0]) for v in _inputs(graph[nid]).values() if is_link(v)}


def _id_key(n: str) -> tuple[int, Any]:
    return (0, int(n)) if n.isdigit() else (1, n)


def dependency_cycles(graph: Mapping[str, Any], nodes: set[str]) -> list[list[str]]:
    """For every node that lies ON a dependency cycle, the shortest cycle through it as a path
    ``[node, dep, dep-of-dep, ..., node]``. Nodes merely downstream of a cycle are not reported: their
    own inputs are fine."""
    _, stuck = topological_order(graph, nodes)
    within = set(stuck)
    found: list[list[str]] = []
    for start in stuck:
        # Breadth-first over dependencies from `start`; `via[d]` is the node that takes input from d.
        via: dict[str, str] = {}
        queue = deque()
        for d in sorted(_deps(graph, start) & within, key=_id_key):
            via.setdefault(d, start)
            queue.append(d)
        while queue and start not in via:
            cur = queue.popleft()
            for d in sorted(_deps(graph, cur) & within, key=_id_key):
                if d not in via:
                    via[d] = cur
                    queue.append(d)
        if start not in via:
            continue  # downstream of a cycle, not on one
        users = [start]  # walk back: start is used by via[start], which is used by ...
        cur = via[start]
        while cur != start:
            users.append(cur)
            cur = via[cur]
        found.append([start, *reversed(users[1:]), start])
    return found


def dependent_outputs(graph: Mapping[str, Any], node_classes: Mapping[str, type]) -> dict[str, list[str]]:
    """Node id -> the output nodes that need it (itself included), ComfyUI's ``dependent_outputs``."""
    out: dict[str, list[str]] = {}
    for oid in output_nodes(graph, node_classes):
        for nid in sorted(_upstream(graph, [oid]), key=_id_key):
            out.setdefault(nid, []).append(oid)
    return out


def _custom_validation(cls: type, nid: str, ct: str, inputs: Mapping[str, Any]) -> NodeError | None:
    """A class's own ``VALIDATE_INPUTS``, called (as ComfyUI does) with the inputs its signature names."""
    validate = getattr(cls, "VALIDATE_INPUTS", None)
    if validate is None:
        return None
    literal = {k: v for k, v in inputs.items() if not is_link(v)}
    try:
        params = inspect.signature(validate).parameters
    except (TypeError, ValueError):
        return None
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        literal = {k: v for k, v in literal.items() if k in params}
        needs = [n for n, p in params.items()
                 if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        if any(n not in literal for n in needs):
            return None  # it asks for a linked input, whose value exists only at run time
    try:
        verdict = validate(**literal)
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


# --- validation -------------------------------------------------------------------------------


def default_node_classes() -> dict[str, type]:
    from ...nodes import NODE_CLASS_MAPPINGS

    return dict(NODE_CLASS_MAPPINGS)


def validate_graph(graph: Any, node_classes: Mapping[str, type] | None = None) -> list[NodeError]:
    """Every problem in ``graph``'s nodes (empty list = valid). Checks, per node: known class_type,
    required inputs present, link shape, link target exists and produces the expected type, literal
    values within their widget's type/range/list, and the graph for dependency cycles.

    Problems of the graph as a whole (not an object, empty, no output node) raise
    :class:`GraphValidationError` directly, since no node can be named."""
    classes = node_classes if node_classes is not None else default_node_classes()
    errors: list[NodeError] = []
    if isinstance(graph, Mapping):
        graph = {str(k): v for k, v in graph.items()}
    if not isinstance(graph, Mapping) or not graph:
        raise GraphValidationError(
            [],
            {
                "type": "invalid_prompt",
                "message": "Graph must be a non-empty JSON object of {node_id: {class_type, inputs}}",
                "details": "",
                "extra_info": {},
            },
        )
    for raw_id, node in graph.items():
        nid = str(raw_id)
        if not isinstance(node, Mapping) or "class_type" not in node:
            errors.append(
                NodeError(nid, "", "invalid_prompt", f"Node {nid} has no class_type: write {{\"class_type\": ..., \"inputs\": {{...}}}}")
            )
            continue
        ct = node["class_type"]
        cls = classes.get(ct)
        if cls is None:
            errors.append(
                NodeError(nid, str(ct), "invalid_prompt", f"Cannot execute because node {nid} has an unknown class_type {ct!r}: this node type does not exist")
            )
            continue
        inputs = node.get("inputs", {})
        if not isinstance(inputs, Mapping):
            errors.append(NodeError(nid, ct, "invalid_prompt", f"Node {nid} ({ct}): inputs must be an object"))
            continue
        required, optional = _input_specs(cls)
        for name, spec in {**required, **optional}.items():
            kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
            if isinstance(kind, str) and kind in _HIDDEN_VALUES:
                continue
            if name not in inputs:
                if name in required:
                    errors.append(
                        NodeError(nid, ct, "required_input_missing", f"Required input is missing: '{name}' of {_node_label(nid, ct)}", name, name)
                    )
                continue
            value = inputs[name]
            if is_link(value):
                src_id = str(value[0])
                src = graph.get(src_id) if src_id in graph else graph.get(value[0])  # type: ignore[arg-type]
                src_cls = classes.get(src.get("class_type")) if isinstance(src, Mapping) else None
                if src is None:
                    errors.append(
                        NodeError(nid, ct, "bad_linked_input", f"Bad linked input: '{name}' of {_node_label(nid, ct)} links to node {src_id}, which is not in the graph", str(value), name, {"received_value": list(value)})
                    )
                    continue
                if src_cls is None:
                    continue  # reported on the source node itself
                rtypes = list(getattr(src_cls, "RETURN_TYPES", ()))
                idx = value[1]
                if idx < 0 or idx >= len(rtypes):
                    errors.append(
                        NodeError(nid, ct, "bad_linked_input", f"Bad linked input: '{name}' of {_node_label(nid, ct)} links to output {idx} of node {src_id} ({src['class_type']}), which has {len(rtypes)} outputs", str(value), name, {"received_value": list(value)})
                    )
                    continue
                if not _types_match(rtypes[idx], kind):
                    errors.append(
                        NodeError(nid, ct, "return_type_mismatch", f"Return type mismatch between linked nodes: '{name}' of {_node_label(nid, ct)} expects {kind} but node {src_id} ({src['class_type']}) output {idx} is {rtypes[idx]}", f"{name}, received_type({rtypes[idx]}) mismatch input_type({kind})", name, {"received_type": rtypes[idx], "linked_node": [src_id, idx]})
                    )
                continue
            if _looks_like_link(value):
                errors.append(
                    NodeError(nid, ct, "bad_linked_input", f"Bad linked input, must be a length-2 list of [node_id, slot_index]: '{name}' of {_node_label(nid, ct)} is {value!r}", str(value), name, {"received_value": value})
                )
                continue
            errors.extend(_check_widget(nid, ct, name, spec, value))
        if not any(e.node_id == nid for e in errors):  # as in ComfyUI: only after the static checks pass
            custom = _custom_validation(cls, nid, ct, inputs)
            if custom is not None:
                errors.append(custom)
    well_formed = {nid for nid, node in graph.items() if isinstance(node, Mapping) and isinstance(node.get("inputs", {}), Mapping)}
    for path in dependency_cycles(graph, well_formed):
        nid = path[0]
        ct = str(graph[nid].get("class_type", ""))
        chain = " <- ".join(path)
        errors.append(
            NodeError(nid, ct, "dependency_cycle", f"Dependency cycle detected: {_node_label(nid, ct)} depends on itself through its inputs: {chain}", chain)
        )
    if not errors and not output_nodes(graph, classes):
        raise GraphValidationError(
            [],
            {
                "type": "prompt_no_outputs",
                "message": "Prompt has no outputs: add an output node (e.g. TrainingLoop, Evaluate, ModelSaver, Predict)",
                "details": "",
                "extra_info": {},
            },
        )
    return errors


def check_graph(graph: Any, node_classes: Mapping[str, type] | None = None) -> None:
    """Raise :class:`GraphValidationError` unless ``graph`` is valid."""
    classes = node_classes if node_classes is not None else default_node_classes()
    errors = validate_graph(graph, classes)
    if errors:
        graph = {str(k): v for k, v in graph.items()}
        raise GraphValidationError(errors, None, dependent_outputs(graph, classes))


# --- execution --------------------------------------------------------------------------------


@dataclass
class ExecutionResult:
    """Outputs of every executed node, and the ``ui`` dicts of output nodes."""

    outputs: dict[str, tuple] = field(default_factory=dict)
    ui: dict[str, Any] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)


def _normalise(node_id: str, class_type: str, cls: type, result: Any, ui: dict[str, Any]) -> tuple:
    if isinstance(result, dict):
        if "ui" in result:
            ui[node_id] = result["ui"]
        result = result.get("result", ())
    if result is None:
        result = ()
    if not isinstance(result, tuple):
        result = tuple(result) if isinstance(result, list) else (result,)
    expected = len(getattr(cls, "RETURN_TYPES", ()))
    if len(result) < expected:
        raise TypeError(f"node {node_id} ({class_type}) returned {len(result)} values, its RETURN_TYPES has {expected}")
    return result


OutputsHook = Callable[[str, str, type, tuple, Any], None]


def execute_graph(
    graph: Mapping[str, Any],
    ctx: RunContext | None = None,
    node_classes: Mapping[str, type] | None = None,
    on_outputs: OutputsHook | None = None,
) -> ExecutionResult:
    """Validate then run ``graph``; returns every executed node's outputs.

    With ``ctx`` the nodes report to that run context (events, stop flag, devices); without it they
    report to the host or logging. ``on_outputs(node_id, class_type, cls, outputs, ui)`` sees each
    node's results as it finishes (``record_outputs``). Raises GraphValidationError, NodeExecutionError
    or RunStopped.
    """
    if ctx is not None and runtime.current() is not ctx:
        with runtime.use(ctx):
            return execute_graph(graph, ctx, node_classes, on_outputs)
    classes = node_classes if node_classes is not None else default_node_classes()
    graph = {str(k): v for k, v in graph.items()} if isinstance(graph, Mapping) else graph
    check_graph(graph, classes)
    targets = _upstream(graph, output_nodes(graph, classes))
    order, _ = topological_order(graph, targets)
    result = ExecutionResult(order=order)
    own_ctx = ctx if ctx is not None else runtime.current()

    def emit(type_: str, payload: dict[str, Any]) -> None:
        if own_ctx is not None:
            own_ctx.emit(type_, payload)

    for index, nid in enumerate(order):
        node = graph[nid]
        ct = node["class_type"]
        cls = classes[ct]
        if own_ctx is not None and own_ctx.stop_event.is_set():
            raise RunStopped(f"stopped before node {nid} ({ct})")
        required, optional = _input_specs(cls)
        specs = {**required, **optional}
        kwargs: dict[str, Any] = {}
        for name, value in (node.get("inputs") or {}).items():
            if name not in specs:
                continue  # ComfyUI ignores inputs a class does not declare (e.g. stale widgets)
            kwargs[name] = result.outputs[str(value[0])][value[1]] if is_link(value) else _coerce(specs[name], value)
        for name, spec in specs.items():
            kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
            if kind == "UNIQUE_ID":
                kwargs[name] = nid
        emit("node_started", {"node": nid, "class_type": ct, "index": index, "total": len(order)})
        started = time.perf_counter()
        previous = (own_ctx.node_id, own_ctx.class_type) if own_ctx is not None else None
        if own_ctx is not None:
            own_ctx.node_id, own_ctx.class_type = nid, ct
        try:
            obj = cls()
            raw = getattr(obj, cls.FUNCTION)(**kwargs)
            result.outputs[nid] = _normalise(nid, ct, cls, raw, result.ui)
        except RunStopped:
            raise
        except Exception as exc:  # noqa: BLE001 - every node failure is reported with the node named
            err = NodeExecutionError(nid, ct, exc)
            emit("node_error", {"node": nid, "class_type": ct, "message": str(err), "traceback": err.traceback})
            raise err from exc
        finally:
            if own_ctx is not None and previous is not None:
                own_ctx.node_id, own_ctx.class_type = previous
        emit(
            "node_finished",
            {"node": nid, "class_type": ct, "seconds": round(time.perf_counter() - started, 4), "index": index, "total": len(order)},
        )
        if on_outputs is not None:
            on_outputs(nid, ct, cls, result.outputs[nid], result.ui.get(nid))
    return result
