"""What ``POST /api/runs`` accepts (docs/sidecar.md, docs/limits.md): the body validated into a typed request.

API validation, not the slot rule: the :class:`~..contracts.runs.RunSubmit` contract checks every field
with a 400 that names it and says what to fix (the same model generates the OpenAPI schema), and an option
that is not built yet is refused by name rather than accepted and ignored.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic import BaseModel

from ...common.errors import RequestError
from ...constants import LOCAL_PROVIDER, RUN_KIND_COMFYUI
from ...nodes import mounts
from ..comfyflow.kind import is_workflow
from ..contracts import graph_shape
from ..contracts.base import ContractError, not_available, validate  # noqa: F401 (not_available re-exported)
from ..contracts.run_target import parse_devices, parse_memory, parse_spread, parse_target  # noqa: F401 (re-exported)
from ..contracts.runs import RECORD_MODES, RunOptions, RunSubmit  # noqa: F401 (re-exported)
from ..scheduling.routing import RunTarget

LOCAL = LOCAL_PROVIDER
M = TypeVar("M", bound=BaseModel)


# --- the request (pure) ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunRequest:
    """A validated ``POST /api/runs`` body."""

    graph: dict[str, Any]
    options: dict[str, Any]
    target: RunTarget
    name: str | None = None
    seed: int | None = None


OPTION_FIELDS = tuple(RunOptions.model_fields)


def parse_run_request(body: Any) -> RunRequest:
    """Validate ``{"graph": {...}, "options": {...}}`` with the :class:`RunSubmit` contract; raise
    RequestError naming the field to fix."""
    return run_request_of(parse_body(RunSubmit, body), body)


def run_request_of(submit: RunSubmit, body: Mapping[str, Any]) -> RunRequest:
    """The typed request of a body ``submit`` validated (``body``: the object as sent, whose options are
    kept as given: the model's numbers are floats)."""
    graph = submit.graph
    opts = submit.options if submit.options is not None else RunOptions()
    target = opts.run_target
    labels = mounts.labels_in_graph(graph)
    if labels:
        target = dataclasses.replace(target, mounts=tuple(labels))
    clean = {k: v for k, v in (body.get("options") or {}).items() if v is not None}
    if opts.name is not None:
        clean["name"] = opts.name
    graph_clean = {str(k): dict(v) for k, v in graph.items()}
    if is_workflow(graph_clean):  # a ComfyUI run: routed only where its ComfyUI can run it (routing.py)
        target = dataclasses.replace(target, kind=RUN_KIND_COMFYUI, workflow=graph_clean)
    return RunRequest(graph=graph_clean, options=clean, target=target, name=opts.name, seed=opts.seed)


def parse_body(model: type[M], body: Any) -> M:
    """``body`` validated by its contract ``model``; raise RequestError (the field's own text)."""
    try:
        return validate(model, body)
    except ContractError as exc:
        raise RequestError(exc.message, exc.extra, exc.status) from None


def check_graph_shape(graph: Any) -> None:
    """The graph's size and shape within the limits (contracts/graph_shape.py); raise RequestError (413
    over the node count)."""
    try:
        graph_shape.check_graph_shape(graph)
    except ContractError as exc:
        raise RequestError(exc.message, exc.extra, exc.status) from None


