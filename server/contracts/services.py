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
# A number's range and a flag are checked by units/spec.py after the model (its texts give the range and
# the value sent); the model checks each object's shape and fields.
Seconds = Annotated[Any, ruled(float | None)]


def _texts(where: str) -> tuple[str, str]:
    return f"{where}: must be an object", f"{where}: unknown field(s) {{unknown}}; known: {{known}}"


class Unit(Contract):
    """How many instances make one unit, and whether a guard watches it."""

    shape_texts = _texts("unit")
    size: Annotated[Any, ruled(Annotated[int, Field(ge=1, le=MAX_UNIT_SIZE)] | None)] = None
    guard: Annotated[Any, ruled(bool | None)] = None


class ServiceTarget(Contract):
    """Where a service's instances run."""

    model_config = ConfigDict(extra="allow")
    worker: str | None = None
    device: str | None = None


class Restart(Contract):
    """The restart budget of an instance."""

    shape_texts = _texts("restart")
    max_restarts: Annotated[Any, ruled(Annotated[int, Field(ge=0, le=1000)] | None)] = None
    window_s: Seconds = None
    backoff_s: Seconds = None
    backoff_max_s: Seconds = None


class Routing(Contract):
    """How long a request waits for a ready unit, and for its answer."""

    shape_texts = _texts("routing")
    wait_s: Seconds = None
    request_timeout_s: Seconds = None


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
    replicas: Annotated[Any, ruled(Annotated[int, Field(ge=1, le=MAX_REPLICAS)] | None)] = None
    target: Annotated[Any, ruled(str | ServiceTarget | None)] = None
    restart: Restart | None = None
    routing: Routing | None = None
    ready_timeout_s: Seconds = None
    drain_timeout_s: Seconds = None


class ServiceUpdate(ServiceSpec):
    """``PUT /api/services/{name}``: a new spec for the service the URL names (``name`` may be left out)."""

    missing_texts = {"program": ServiceSpec.missing_texts["program"]}
    name: Annotated[str | None, Field(pattern=SERVICE_NAME_PATTERN), refuse(NAME_TEXT)] = None


class InferRequest(Contract):
    """The program's request, passed to rank 0 as is; the built-in model server takes
    ``{"inputs": [sample, ...], "output": "raw|classes|probabilities"}``."""

    model_config = ConfigDict(extra="allow")
