"""The service contracts: the body of ``POST /api/services`` and ``PUT /api/services/{name}``
(docs/services.md) and a request to a service. ``units/spec.py`` validates a spec with its rule
functions (the program's kind, placeholders, ranges with their texts); its field lists are these models'."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field

from .base import Contract, refuse, ruled

SERVICE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$"  # a DNS-1123 label (a Kubernetes object name)
MAX_UNIT_SIZE = 64
MAX_REPLICAS = 64


NAME_TEXT = ("name: 1-42 lowercase letters, digits and '-', starting and ending with a letter or digit (a "
             "Kubernetes name), e.g. \"digits\"")


def _count(where: str, lo: int, hi: int) -> Any:
    return Annotated[int | None, Field(ge=lo, le=hi),
                     refuse(lambda v: f"{where}: must be an integer from {lo} to {hi}, got {v!r}")]


def _seconds(where: str, lo: float, hi: float, lo_open: bool = False) -> Any:
    """A number of seconds in [lo, hi] (``lo_open``: above lo), with the API's text."""
    low = f"more than {lo:g}" if lo_open else f"from {lo:g}"
    bound = Field(gt=lo, le=hi) if lo_open else Field(ge=lo, le=hi)
    return Annotated[float | None, bound,
                     refuse(lambda v: f"{where}: must be a number of seconds {low} to {hi:g}, got {v!r}")]


def _texts(where: str) -> tuple[str, str]:
    return f"{where}: must be an object", f"{where}: unknown field(s) {{unknown}}; known: {{known}}"


class Unit(Contract):
    """How many instances make one unit, and whether a guard watches it."""

    shape_texts = _texts("unit")
    size: _count("unit.size", 1, MAX_UNIT_SIZE) = None  # type: ignore[valid-type]
    guard: Annotated[bool | None, refuse(lambda v: f"unit.guard: must be true or false, got {v!r}")] = None


class ServiceTarget(Contract):
    """Where a service's instances run."""

    model_config = ConfigDict(extra="allow")
    worker: str | None = None
    device: str | None = None


class Restart(Contract):
    """The restart budget of an instance."""

    shape_texts = _texts("restart")
    max_restarts: _count("restart.max_restarts", 0, 1000) = None  # type: ignore[valid-type]
    window_s: _seconds("restart.window_s", 1, 7 * 86400) = None  # type: ignore[valid-type]
    backoff_s: _seconds("restart.backoff_s", 0, 3600) = None  # type: ignore[valid-type]
    backoff_max_s: _seconds("restart.backoff_max_s", 0, 86400) = None  # type: ignore[valid-type]


class Routing(Contract):
    """How long a request waits for a ready unit, and for its answer."""

    shape_texts = _texts("routing")
    wait_s: _seconds("routing.wait_s", 0, 300) = None  # type: ignore[valid-type]
    request_timeout_s: _seconds("routing.request_timeout_s", 0, 3600, lo_open=True) = None  # type: ignore[valid-type]


class ServiceSpec(Contract):
    """A service: ``replicas`` units of ``unit.size`` instances, one worker card each."""

    shape_texts = ("the body must be a JSON object {\"name\", \"program\", \"unit\", \"replicas\", \"target\"}",
                   "unknown field(s) {unknown}; known: {known}")
    missing_texts = {"name": NAME_TEXT,
                     "program": "program: missing; give {\"model\": {\"path\": ...}} or {\"command\": [...]}"}
    name: Annotated[str, Field(pattern=SERVICE_NAME_PATTERN), refuse(NAME_TEXT)]
    program: Annotated[Any, ruled(dict[str, Any])] = Field(
        description="{\"model\": {\"path\", \"split\", \"max_batch\", \"collective_timeout_s\"}} or "
                    "{\"command\": [...], \"health_path\", \"infer_path\", \"env\"}")
    unit: Unit | None = None
    replicas: Annotated[int | None, Field(ge=1, le=MAX_REPLICAS), refuse(
        lambda v: f"replicas: the number of units, an integer from 1 to {MAX_REPLICAS}, got {v!r}")] = None
    target: Annotated[Any, ruled(str | ServiceTarget | None)] = None
    restart: Restart | None = None
    routing: Routing | None = None
    ready_timeout_s: _seconds("ready_timeout_s", 0, 86400, lo_open=True) = None  # type: ignore[valid-type]
    drain_timeout_s: _seconds("drain_timeout_s", 0, 3600) = None  # type: ignore[valid-type]


class ServiceUpdate(ServiceSpec):
    """``PUT /api/services/{name}``: a new spec for the service the URL names (``name`` may be left out)."""

    missing_texts = {"program": ServiceSpec.missing_texts["program"]}
    name: Annotated[str | None, Field(pattern=SERVICE_NAME_PATTERN), refuse(NAME_TEXT)] = None


class InferRequest(Contract):
    """The program's request, passed to rank 0 as is; the built-in model server takes
    ``{"inputs": [sample, ...], "output": "raw|classes|probabilities"}``."""

    model_config = ConfigDict(extra="allow")
