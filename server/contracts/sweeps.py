"""The sweep and study contracts: the bodies of ``POST /api/sweeps`` and ``POST /api/studies``
(docs/sweeps.md) and their enums.

A spec's checks need its graph (a parameter's path, the type of the value it replaces), so
``sweeps/spec.py`` validates them with its rule functions; its field lists and enums are these models'.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from ...constants import SWEEP_DEFAULT_MAX_RUNS, SWEEP_MAX_RUNS
from .base import Contract
from .runs import RunOptions

DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("median", "none")
SAMPLERS = ("tpe", "random")
MODES = ("grid", "random")

Direction = Literal[DIRECTIONS]  # type: ignore[valid-type]
Scalar = float | str | bool
Values = Annotated[list[Scalar], Field(min_length=1)]
GraphObject = Annotated[dict[str, Any], Field(min_length=1, description="the base graph, ComfyUI API format")]


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


class Objective(Contract):
    """What a sweep ranks by and a study optimizes."""

    metric: str = Field(description="a metric the runs report (its last value counts), e.g. val_accuracy")
    direction: Direction | None = Field(  # type: ignore[valid-type]
        None, description="may be left out for the TrainingLoop's and Evaluate's own metrics")


class Pruner(Contract):
    """A study's pruner as an object."""

    type: Literal[PRUNERS] | None = None  # type: ignore[valid-type]
    metric: str | None = Field(None, description="reported while training, e.g. val_loss_step")
    direction: Direction | None = None  # type: ignore[valid-type]
    n_startup_trials: int = Field(5, ge=0)
    n_warmup_steps: int = Field(0, ge=0)
    interval_steps: int = Field(1, ge=1)


class Sampler(Contract):
    """A study's sampler as an object."""

    type: Literal[SAMPLERS] | None = None  # type: ignore[valid-type]
    seed: int | None = Field(None, ge=0)


class SweepSubmit(Contract):
    """The body of ``POST /api/sweeps``."""

    name: str | None = None
    graph: GraphObject
    mode: Literal[MODES] = "grid"  # type: ignore[valid-type]
    parameters: Parameters | None = None
    samples: int | None = Field(None, ge=1, description="random mode: points to draw")
    random_seed: int | None = Field(None, ge=0, description="random mode: reproducible draws")
    seeds: Annotated[int, Field(ge=1)] | list[int] | None = Field(
        None, description="seed variants: N (seeds 0..N-1) or a list; each point once per seed")
    set: SetValues | None = None
    objective: Objective
    options: RunOptions | None = Field(None, description="POST /api/runs options given to every child (no name)")
    max_runs: int | None = Field(None, ge=1, le=SWEEP_MAX_RUNS, description="a larger expansion is rejected (never "
                                 f"truncated); default {SWEEP_DEFAULT_MAX_RUNS}")


class StudySubmit(Contract):
    """The body of ``POST /api/studies``."""

    name: str | None = None
    graph: GraphObject
    parameters: Parameters
    n_trials: int = Field(ge=1, description="the trial budget: runs the study may queue")
    parallel: int = Field(1, ge=1, description="trials in flight at once")
    objective: Objective
    pruner: Literal[PRUNERS] | Pruner | None = None  # type: ignore[valid-type]
    sampler: Literal[SAMPLERS] | Sampler | None = None  # type: ignore[valid-type]
    set: SetValues | None = None
    options: RunOptions | None = Field(None, description="POST /api/runs options given to every trial (no name)")
    max_runs: int | None = Field(None, ge=1, le=SWEEP_MAX_RUNS, description="n_trials above it is a 400")
