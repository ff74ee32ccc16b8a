"""The contracts of the remaining routes: a canvas run (docs/canvas-runs.md), the predictor
(docs/predictor.md) and the standalone page's login (docs/ui.md)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ...constants import CANVAS_EVENT_TYPES, CANVAS_EVENTS_MAX, MAX_RUN_NAME_CHARS, TERMINAL_STATUSES
from .base import Contract
from .runs import Graph

Seq = Annotated[int, Field(ge=1, le=2**63 - 1)]
PROMPT_ID_CHARS = 100  # ComfyUI's prompt ids are UUIDs; this bounds what a canvas run records
ERROR_CHARS = 20_000  # a canvas run's error text


class CanvasRun(Contract):
    """``POST /api/canvas/runs``: ComfyUI's own Run, recorded by the plugin."""

    prompt_id: str = Field(min_length=1, max_length=PROMPT_ID_CHARS)
    name: str | None = Field(None, max_length=MAX_RUN_NAME_CHARS)
    graph: Graph
    comfy_pid: int = Field(ge=1, le=2**63 - 1)


class CanvasEvent(Contract):
    """One event of a canvas run."""

    type: Literal[CANVAS_EVENT_TYPES]  # type: ignore[valid-type]
    payload: dict[str, Any]
    ts: float
    seq: Seq


class CanvasFinished(Contract):
    """How a canvas run ended."""

    status: Literal[tuple(sorted(TERMINAL_STATUSES))]  # type: ignore[misc]
    error: str | None = Field(None, max_length=ERROR_CHARS)
    final_metrics: dict[str, float | None] | None = None


class CanvasEvents(Contract):
    """``POST /api/canvas/runs/{run_id}/events``: a batch of a canvas run's events, and its end."""

    name: str | None = Field(None, max_length=MAX_RUN_NAME_CHARS)
    events: list[CanvasEvent] = Field(max_length=CANVAS_EVENTS_MAX)
    finished: CanvasFinished | None = None


class PredictOptions(Contract):
    """What the predictor counts."""

    weight_bytes: bool | None = None
    topology: bool | None = None
    activation_overhead: Any = None
    calibration: Any = None


class PredictRequest(Contract):
    """``POST /api/predict``: a workflow's memory prediction."""

    model_config = {"json_schema_extra": {"example": {"workflow": {"1": {
        "class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}}}}}}
    workflow: dict[str, Any] = Field(description="UI or API format workflow")
    platform: str | None = Field(None, description="nvidia, intel or a configured name")
    worker: str | None = None
    device: str | None = None
    options: PredictOptions | None = None
    snapshot: dict[str, Any] | None = Field(None, description="figures that replace the measured ones")
    prompt: dict[str, Any] | None = Field(None, description="the same graph in API format: a training graph's peak "
                                                            "is its static estimate")


class Login(Contract):
    """``POST /api/ui/session``: a login link's secret, exchanged for a session cookie."""

    login: str


class LoginLinks(Contract):
    """``POST /api/ui/login-links``: no fields."""
