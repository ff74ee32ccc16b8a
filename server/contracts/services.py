"""The service contracts: the body of ``POST /api/services`` and ``PUT /api/services/{name}``
(docs/services.md) and a request to a service. ``units/spec.py`` validates a spec with its rule
functions (the program's kind, placeholders, ranges with their texts); its field lists are these models'."""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field

from .base import Contract

SERVICE_NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,40}[a-z0-9])?$"  # a DNS-1123 label (a Kubernetes object name)
MAX_UNIT_SIZE = 64
MAX_REPLICAS = 64


class Unit(Contract):
    """How many instances make one unit, and whether a guard watches it."""

    size: int | None = Field(None, ge=1, le=MAX_UNIT_SIZE)
    guard: bool | None = None


class ServiceTarget(Contract):
    """Where a service's instances run."""

    model_config = ConfigDict(extra="allow")
    worker: str | None = None
    device: str | None = None


class Restart(Contract):
    """The restart budget of an instance."""

    max_restarts: int | None = Field(None, ge=0)
    window_s: float | None = None
    backoff_s: float | None = None
    backoff_max_s: float | None = None


class Routing(Contract):
    """How long a request waits for a ready unit, and for its answer."""

    wait_s: float | None = None
    request_timeout_s: float | None = None


class ServiceSpec(Contract):
    """A service: ``replicas`` units of ``unit.size`` instances, one worker card each."""

    name: str = Field(pattern=SERVICE_NAME_PATTERN)
    program: dict[str, Any] = Field(description="{\"model\": {\"path\", \"split\", \"max_batch\", "
                                                "\"collective_timeout_s\"}} or {\"command\": [...], \"health_path\", "
                                                "\"infer_path\", \"env\"}")
    unit: Unit | None = None
    replicas: int | None = Field(None, ge=1, le=MAX_REPLICAS)
    target: str | ServiceTarget | None = None
    restart: Restart | None = None
    routing: Routing | None = None
    ready_timeout_s: float | None = None
    drain_timeout_s: float | None = None


class InferRequest(Contract):
    """The program's request, passed to rank 0 as is; the built-in model server takes
    ``{"inputs": [sample, ...], "output": "raw|classes|probabilities"}``."""

    model_config = ConfigDict(extra="allow")
