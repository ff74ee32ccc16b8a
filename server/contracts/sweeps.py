"""The sweep and study contracts: the bodies of ``POST /api/sweeps`` and ``POST /api/studies``
(docs/sweeps.md) and their enums.

A body is validated by its model first (its shape, fields, scalar ranges, objective, pruner and sampler
objects, with the API's texts); the checks that need its graph (a parameter's path, the type of the value
it replaces) or run per child (the options) are ``sweeps/spec.py``'s rule functions after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, model_validator

from ...constants import STUDY_MAX_PARALLEL, SWEEP_DEFAULT_MAX_RUNS, SWEEP_MAX_RUNS
from ..comfyflow.kind import is_workflow
from .base import Contract, refuse, ruled
from .runs import RunOptions

DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("median", "none")
SAMPLERS = ("tpe", "random")
MODES = ("grid", "random")

Direction = Literal[DIRECTIONS]  # type: ignore[valid-type]
Scalar = float | str | bool
Values = Annotated[list[Scalar], Field(min_length=1)]


class ParamRange(Contract):
    """A parameter's values as an object: ``{values}`` or a range ``{low, high, log, type, steps|step}``."""

    values: Values | None = None
    low: float | None = None
    high: float | None = None
    log: bool | None = None
    type: Literal["int", "float"] | None = None
    steps: int | None = Field(None, ge=2)
    step: float | None = Field(None, gt=0)


Parameter = Annotated[Values | ParamRange, Field(
    description="a parameter's values: a list, {values}, or a range {low, high, log, type, steps|step} (a grid "
                "range needs steps or step; type defaults to the type of the graph's value)")]
Parameters = Annotated[dict[str, Parameter], Field(
    description="\"<node id>.<input>\" (e.g. \"5.lr\") -> values or a range")]
SetValues = Annotated[dict[str, Scalar], Field(description="\"<node id>.<input>\" -> one value set on every child")]


def _int_text(field: str, lo: int, hi: int) -> Any:
    return refuse(lambda v: f"{field}: must be an integer between {lo} and {hi}, got {v!r}")


def _direction_text(where: str) -> Any:
    return refuse(lambda v: f"{where}.direction: must be maximize or minimize, got {v!r}")


def _kind_text(where: str, kinds: tuple[str, ...]) -> Any:
    return refuse(lambda v: f"{where}.type: must be one of {', '.join(kinds)}, got {v!r}")


def _named(documented: Any) -> BeforeValidator:
    """A pruner or sampler given by its type's name alone (``"median"``) is ``{"type": "median"}``."""
    return BeforeValidator(lambda v: {"type": v} if isinstance(v, str) else v, json_schema_input_type=documented)


OBJECTIVE_MISSING = "objective: missing; give {\"metric\": \"val_accuracy\", \"direction\": \"maximize\"}"
METRIC_TEXT = "objective.metric: the name of a metric the runs report, e.g. val_accuracy"


class Objective(Contract):
    """What a sweep ranks by and a study optimizes."""

    shape_texts = (OBJECTIVE_MISSING, "objective: unknown field(s) {unknown}; it has metric and direction")
    missing_texts = {"metric": METRIC_TEXT}
    metric: Annotated[str, refuse(METRIC_TEXT)] = Field(
        description="a metric the runs report (its last value counts), e.g. val_accuracy")
    direction: Annotated[Direction | None, _direction_text("objective")] = Field(  # type: ignore[valid-type]
        None, description="may be left out for the TrainingLoop's and Evaluate's own metrics")


class Pruner(Contract):
    """A study's pruner as an object (a string names its type)."""

    shape_texts = ("pruner: give {\"type\": \"median\", \"metric\": \"val_loss_step\"} or \"none\"",
                   "pruner: unknown field(s) {unknown}; it has {sorted}")
    type: Annotated[Literal[PRUNERS] | None, _kind_text("pruner", PRUNERS)] = None  # type: ignore[valid-type]
    metric: Annotated[str | None, refuse("pruner.metric: the metric runs report while they train, e.g. "
                                         "val_loss_step")] = Field(None, description="reported while training")
    direction: Annotated[Direction | None, _direction_text("pruner")] = None  # type: ignore[valid-type]
    n_startup_trials: Annotated[int, Field(ge=0, le=SWEEP_MAX_RUNS),
                                _int_text("pruner.n_startup_trials", 0, SWEEP_MAX_RUNS)] = 5
    n_warmup_steps: Annotated[int, Field(ge=0, le=2**40), _int_text("pruner.n_warmup_steps", 0, 2**40)] = 0
    interval_steps: Annotated[int, Field(ge=1, le=2**40), _int_text("pruner.interval_steps", 1, 2**40)] = 1


class Sampler(Contract):
    """A study's sampler as an object (a string names its type)."""

    shape_texts = ("sampler: give {\"type\": \"tpe\", \"seed\": 0} or \"random\"",
                   "sampler: unknown field(s) {unknown}; it has type and seed")
    type: Annotated[Literal[SAMPLERS] | None, _kind_text("sampler", SAMPLERS)] = None  # type: ignore[valid-type]
    seed: Annotated[int | None, Field(ge=0, le=2**32 - 1), _int_text("sampler.seed", 0, 2**32 - 1)] = None


def _graph_text(value: Any) -> str:
    if isinstance(value, str):
        return ("graph: must be the graph object in ComfyUI's API format (the CLI reads a file path for you; the "
                "API takes the graph itself)")
    return GRAPH_MISSING


GRAPH_MISSING = "graph: missing; send the base graph in ComfyUI's API format as \"graph\""
Name = Annotated[str | None, refuse("name: must be a non-empty string")]
GraphField = Annotated[dict[str, Any], Field(min_length=1, description="the base graph, ComfyUI API format"),
                       refuse(_graph_text)]
MaxRuns = Annotated[int | None, Field(ge=1, le=SWEEP_MAX_RUNS), _int_text("max_runs", 1, SWEEP_MAX_RUNS)]
# Checked by sweeps/spec.py after the model: the paths need the graph, the options are checked per child
# as POST /api/runs checks a run (its texts name the variant), seeds and options.seed exclude each other.
OptionsField = Annotated[Any, ruled(RunOptions | None)]


def _texts(what: str, needs: str) -> tuple[str, str]:
    return (f"the body must be an object with {needs} (a {what} spec)",
            f"unknown field(s) {{unknown}}; a {what} has {{known}}")


# A sweep of a ComfyUI workflow (a fan-out of seeds, a grid of widgets) reports no metric to rank by: its
# objective may be left out (its variants are shown in order) and this one is recorded.
COMFYUI_OBJECTIVE = {"metric": "duration_s", "direction": "minimize"}


def with_workflow_objective(body: Any) -> Any:
    """``body`` with :data:`COMFYUI_OBJECTIVE` when it is a ComfyUI workflow's sweep without an objective."""
    if isinstance(body, Mapping) and body.get("objective") is None and isinstance(body.get("graph"), Mapping) \
            and is_workflow(body["graph"]):
        return {**body, "objective": dict(COMFYUI_OBJECTIVE)}
    return body


class SweepSubmit(Contract):
    """The body of ``POST /api/sweeps`` (a ComfyUI workflow's may leave out its objective)."""

    @model_validator(mode="before")
    @classmethod
    def _workflow_objective(cls, data: Any) -> Any:
        return with_workflow_objective(data)

    shape_texts = _texts("sweep", "graph, parameters and objective")
    missing_texts = {"graph": GRAPH_MISSING, "objective": OBJECTIVE_MISSING}
    name: Name = None
    graph: GraphField
    mode: Annotated[Literal[MODES], refuse(lambda v: f"mode: must be grid or random, got {v!r}")] = "grid"  # type: ignore[valid-type]
    parameters: Annotated[Any, ruled(Parameters | None)] = None
    samples: Annotated[int | None, Field(ge=1, le=SWEEP_MAX_RUNS), _int_text("samples", 1, SWEEP_MAX_RUNS)] = Field(
        None, description="random mode: points to draw")
    random_seed: Annotated[int | None, Field(ge=0, lt=2**63), _int_text("random_seed", 0, 2**63 - 1)] = Field(
        None, description="random mode: reproducible draws")
    seeds: Annotated[Any, ruled(Annotated[int, Field(ge=1)] | list[int] | None)] = Field(
        None, description="seed variants: N (seeds 0..N-1) or a list; each point once per seed")
    set: Annotated[Any, ruled(SetValues | None)] = None
    objective: Objective
    options: OptionsField = Field(None, description="POST /api/runs options given to every child (no name)")
    max_runs: MaxRuns = Field(None, description="a larger expansion is rejected (never truncated); default "
                              f"{SWEEP_DEFAULT_MAX_RUNS}")


class StudySubmit(Contract):
    """The body of ``POST /api/studies``."""

    shape_texts = _texts("study", "graph, parameters and objective")
    missing_texts = {"graph": GRAPH_MISSING, "objective": OBJECTIVE_MISSING,
                     "n_trials": "n_trials: the study's trial budget (how many runs it may queue), e.g. 20"}
    name: Name = None
    graph: GraphField
    parameters: Annotated[Any, ruled(Parameters)] = None
    n_trials: Annotated[int, Field(ge=1, le=SWEEP_MAX_RUNS), _int_text("n_trials", 1, SWEEP_MAX_RUNS),
                        Field(description="the trial budget: runs the study may queue")]
    parallel: Annotated[int, Field(ge=1, le=STUDY_MAX_PARALLEL), _int_text("parallel", 1, STUDY_MAX_PARALLEL)] = Field(
        1, description="trials in flight at once")
    objective: Objective
    pruner: Annotated[Pruner | None, _named(Literal[PRUNERS] | Pruner | None)] = None  # type: ignore[valid-type]
    sampler: Annotated[Sampler | None, _named(Literal[SAMPLERS] | Sampler | None)] = None  # type: ignore[valid-type]
    set: Annotated[Any, ruled(SetValues | None)] = None
    options: OptionsField = Field(None, description="POST /api/runs options given to every trial (no name)")
    max_runs: MaxRuns = Field(None, description="n_trials above it is a 400")
