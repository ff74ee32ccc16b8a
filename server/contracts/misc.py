"""The contracts of the remaining routes: a canvas run (docs/canvas-runs.md), the predictor
(docs/predictor.md) and the standalone page's login (docs/ui.md)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, Field, PlainValidator, model_validator

from ...constants import CANVAS_EVENT_TYPES, CANVAS_EVENTS_MAX, MAX_RUN_NAME_CHARS, TERMINAL_STATUSES
from .base import OBJECT_TEXTS, Contract, ContractError, refuse, ruled, validate
from .runs import Graph

PROMPT_ID_CHARS = 100  # ComfyUI's prompt ids are UUIDs; this bounds what a canvas run records
ERROR_CHARS = 20_000  # a canvas run's error text
C = TypeVar("C", bound=Contract)
AT = "{at}"  # in a canvas event's texts: replaced by its place, events[i]


def object_texts(what: str) -> Callable[[type[C]], type[C]]:
    """A class decorator: the canvas bodies' answers for a body that is not an object, unknown fields and
    missing ones (``what``: the body's place), as the model's ``shape_texts`` and ``missing_texts``."""

    def apply(model: type[C]) -> type[C]:
        fields = ", ".join(sorted(model.model_fields))
        required = sorted(name for name, f in model.model_fields.items() if f.is_required())
        model.shape_texts = (f"{what}: must be a JSON object with {fields}",
                             f"{what}: unknown field(s) {{unknown}}; known: {fields}")
        model.missing_texts = {name: f"{what}: missing {name}" for name in required}
        return model

    return apply


Name = Annotated[str | None, Field(max_length=MAX_RUN_NAME_CHARS),
                 refuse(f"name: must be a string of at most {MAX_RUN_NAME_CHARS} characters (or null)")]


@object_texts("body")
class CanvasRun(Contract):
    """``POST /api/canvas/runs``: ComfyUI's own Run, recorded by the plugin."""

    prompt_id: Annotated[str, Field(min_length=1, max_length=PROMPT_ID_CHARS), refuse(
        f"prompt_id: must be ComfyUI's prompt id, a string of 1-{PROMPT_ID_CHARS} characters")]
    name: Name = None
    graph: Graph
    comfy_pid: Annotated[int, Field(ge=1, le=2**63 - 1), refuse("comfy_pid: must be an integer >= 1")]



def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise ContractError(f"{AT}.ts: must be a finite number")
    return value


@object_texts(AT)
class CanvasEvent(Contract):
    """One event of a canvas run."""

    type: Annotated[Literal[CANVAS_EVENT_TYPES], refuse(  # type: ignore[valid-type]
        lambda v: f"{AT}.type: must be one of {', '.join(CANVAS_EVENT_TYPES)}, got {v!r}")]
    payload: Annotated[dict[str, Any], refuse(f"{AT}.payload: must be an object")]
    ts: Annotated[float, AfterValidator(_finite), refuse(f"{AT}.ts: must be a finite number")]
    seq: Annotated[int, Field(ge=1, le=2**63 - 1), refuse(f"{AT}.seq: must be an integer >= 1")]

    @model_validator(mode="after")
    def _metric_named(self) -> CanvasEvent:
        if self.type == "metric" and not isinstance(self.payload.get("name"), str):
            raise ContractError(f"{AT}.payload.name: a metric names its series (a string)")
        return self



def _events(value: Any) -> list[CanvasEvent]:
    """Each event validated by :class:`CanvasEvent`, its texts naming its place (``events[3].type``)."""
    if not isinstance(value, list) or len(value) > CANVAS_EVENTS_MAX:
        raise ContractError(f"events: must be a list of at most {CANVAS_EVENTS_MAX} events")
    out = []
    for i, raw in enumerate(value):
        try:
            out.append(validate(CanvasEvent, raw))
        except ContractError as exc:
            raise ContractError(exc.message.replace(AT, f"events[{i}]"), exc.status) from None
    return out


@object_texts("finished")
class CanvasFinished(Contract):
    """How a canvas run ended."""

    status: Annotated[Literal[tuple(sorted(TERMINAL_STATUSES))], refuse(  # type: ignore[misc]
        f"finished.status: must be one of {', '.join(sorted(TERMINAL_STATUSES))}")]
    error: Annotated[str | None, Field(max_length=ERROR_CHARS), refuse(
        f"finished.error: must be a string of at most {ERROR_CHARS} characters (or null)")] = None
    final_metrics: Annotated[dict[str, float | None] | None, refuse(
        "finished.final_metrics: must map metric names to numbers (or null)")] = None



@object_texts("body")
class CanvasEvents(Contract):
    """``POST /api/canvas/runs/{run_id}/events``: a batch of a canvas run's events, and its end."""

    name: Name = None
    events: Annotated[list[CanvasEvent], PlainValidator(_events, json_schema_input_type=list[CanvasEvent]),
                      Field(json_schema_extra={"maxItems": CANVAS_EVENTS_MAX})]
    finished: CanvasFinished | None = None



class PredictOptions(Contract):
    """What the predictor counts."""

    weight_bytes: bool | None = None
    topology: bool | None = None
    activation_overhead: Any = None
    calibration: Any = None


class PredictRequest(Contract):
    """``POST /api/predict``: a workflow's memory prediction."""

    shape_texts = OBJECT_TEXTS
    missing_texts = {"workflow": "request body needs \"workflow\": a ComfyUI workflow (UI or API format)"}
    model_config = {"json_schema_extra": {"example": {"workflow": {"1": {
        "class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd15.safetensors"}}}}}}
    # The predictor checks what these hold (predictor/service.py, the card lookup): its own texts.
    workflow: Annotated[Any, ruled(dict[str, Any])] = Field(description="UI or API format workflow")
    platform: Annotated[Any, ruled(str | None)] = Field(None, description="nvidia, intel or a configured name")
    worker: Annotated[Any, ruled(str | None)] = None
    device: Annotated[str | None, refuse("device must be a string such as cuda:0")] = None
    options: Annotated[Any, ruled(PredictOptions | None)] = None
    snapshot: Annotated[Any, ruled(dict[str, Any] | None)] = Field(None, description="figures that replace the "
                                                                                     "measured ones")
    prompt: Annotated[Any, ruled(dict[str, Any] | None)] = Field(
        None, description="the same graph in API format: a training graph's peak is its static estimate")


LOGIN_TEXT = "send {\"login\": \"<key>\"}: the key of the login link `xpufleet ui` printed"


class Login(Contract):
    """``POST /api/ui/session``: a login link's secret, exchanged for a session cookie."""

    shape_texts = OBJECT_TEXTS
    missing_texts = {"login": LOGIN_TEXT}
    login: Annotated[str, Field(min_length=1), refuse(LOGIN_TEXT)]
