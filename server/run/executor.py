"""The graph executor for ComfyUI API-format graphs (docs/nodes.md).

A graph is ``{"<id>": {"class_type": ..., "inputs": {...}}}``; a link is ``[node_id, output_index]``.
The whole graph is validated before anything runs (validation.py: errors come back in the shape
ComfyUI's own ``validate_prompt`` answers with, never as a traceback). Execution is topological
(graph.py), limited (as in ComfyUI) to the output nodes and what they depend on, and stops
cooperatively between nodes (and inside long nodes through ``nodes.runtime.should_stop``).
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...nodes import runtime
from ...nodes.runtime import RunContext, RunStopped
from .graph import (  # noqa: F401 - the executor's public names, as before the split
    dependency_cycles,
    dependent_outputs,
    is_link,
    output_nodes,
    topological_order,
    upstream,
)
from .validation import (  # noqa: F401
    GraphValidationError,
    NodeError,
    ValidationReport,
    check_graph,
    default_node_classes,
    format_errors,
    input_specs,
    validate_graph,
    validate_report,
    validation_response,
)


class NodeExecutionError(Exception):
    """A node raised while running; names the node and keeps the original exception."""

    def __init__(self, node_id: str, class_type: str, exc: BaseException) -> None:
        self.node_id = node_id
        self.class_type = class_type
        self.original = exc
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        super().__init__(f"Node {node_id} ({class_type}) failed: {type(exc).__name__}: {exc}")


def _coerce(spec: Any, value: Any) -> Any:
    kind = spec[0] if isinstance(spec, (list, tuple)) and spec else spec
    if kind == "INT":
        return int(value)
    if kind == "FLOAT":
        return float(value)
    return value


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
    targets = upstream(graph, output_nodes(graph, classes))
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
        required, optional = input_specs(cls)
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
