"""The bodies of ``POST /api/sweeps`` and ``POST /api/studies`` validated into typed specs (pure).

Sweep::

    {"name": "digits-lr", "graph": {...}, "mode": "grid" | "random",
     "parameters": {"5.lr": [0.0005, 0.002], "4.hidden": {"values": ["64", "128,64"]},
                    "8.epochs": {"low": 5, "high": 20, "step": 5}},
     "samples": 16, "random_seed": 0,            # random mode: this many points, reproducibly
     "seeds": 3 | [0, 7, 9],                      # seed variants: each point once per seed (options.seed)
     "set": {"8.tensorboard": false},             # the same value on every variant
     "objective": {"metric": "val_accuracy", "direction": "maximize"},
     "options": {"device": "cuda", "target": {"worker": "any"}},   # as POST /api/runs; every child
     "max_runs": 1000}

Study: ``parameters`` (lists and ranges, no grid steps), ``n_trials``, ``parallel`` (trials in flight),
``objective``, ``pruner`` (``{"type": "median" | "none", "metric", "direction", "n_startup_trials",
"n_warmup_steps", "interval_steps"}``), ``sampler`` (``{"type": "tpe" | "random", "seed"}``), ``set``,
``options``, ``max_runs``.

Caps reject, never truncate: a sweep that expands to more runs than ``max_runs`` (default
``SWEEP_DEFAULT_MAX_RUNS``, at most ``SWEEP_MAX_RUNS``) is a 400 that says how many it would queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ...constants import SWEEP_DEFAULT_MAX_RUNS, SWEEP_MAX_RUNS
from ..contracts.base import Contract, ContractError, validate
from ..contracts.sweeps import METRIC_TEXT, Pruner, Sampler, StudySubmit, SweepSubmit, with_workflow_objective
from ..contracts.sweeps import Objective as ObjectiveBody
from .params import (
    KnownInputs,
    Param,
    SpecError,
    _no_inputs,
    grid_size,
    parse_params,
    resolve_path,
)

C = TypeVar("C", bound=Contract)
MAX_NAME_CHARS = 120
MAX_SEEDS = 1000
SEED_LIMIT = 2**63

# The direction of the metrics the TrainingLoop and Evaluate report (nodes/trainer.py, nodes/training.py);
# another metric needs its direction spelled out.
METRIC_DIRECTIONS: dict[str, str] = {
    "train_loss": "minimize", "train_loss_batch": "minimize", "val_loss": "minimize",
    "val_loss_step": "minimize", "val_accuracy": "maximize", "eval_loss": "minimize",
    "eval_accuracy": "maximize",
}


@dataclass(frozen=True)
class Objective:
    """What ranks variants and what a study optimises: the last value the run reported of ``metric``."""

    metric: str
    direction: str  # "maximize" | "minimize"


@dataclass(frozen=True)
class SweepSpec:
    name: str
    graph: dict[str, Any]
    mode: str  # "grid" | "random"
    params: tuple[Param, ...]
    seeds: tuple[int, ...] | None  # None: one variant per point, with the options' own seed
    objective: Objective
    options: dict[str, Any]
    fixed: dict[str, Any]  # "set": path -> value on every variant
    max_runs: int
    samples: int | None = None  # random mode
    random_seed: int = 0

    @property
    def n_points(self) -> int:
        if self.mode == "random":
            return int(self.samples or 0)
        n = 1
        for p in self.params:
            n *= grid_size(p.domain)
            if n > SWEEP_MAX_RUNS:  # enough to know it is too many; never multiplies out a huge grid
                return n
        return n

    @property
    def n_runs(self) -> int:
        return self.n_points * (len(self.seeds) if self.seeds else 1)


@dataclass(frozen=True)
class PrunerSpec:
    kind: str  # "median" | "none"
    metric: str | None = None
    direction: str | None = None
    n_startup_trials: int = 5
    n_warmup_steps: int = 0
    interval_steps: int = 1


@dataclass(frozen=True)
class SamplerSpec:
    kind: str = "tpe"
    seed: int | None = None


@dataclass(frozen=True)
class StudySpec:
    name: str
    graph: dict[str, Any]
    params: tuple[Param, ...]
    n_trials: int
    parallel: int
    objective: Objective
    pruner: PrunerSpec
    sampler: SamplerSpec
    options: dict[str, Any]
    fixed: dict[str, Any]


# The fields of each body: its contract model's (the same model validates it first and gives the OpenAPI schema).
SWEEP_FIELDS = tuple(SweepSubmit.model_fields)
STUDY_FIELDS = tuple(StudySubmit.model_fields)


def _int(raw: Any, field: str, lo: int, hi: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or not lo <= raw <= hi:
        raise SpecError(f"{field}: must be an integer between {lo} and {hi}, got {raw!r}")
    return raw


def _common(body: Any, model: type[SweepSubmit] | type[StudySubmit], what: str
            ) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """The body validated by its contract ``model`` first (shape, fields, types: its texts), then name,
    graph and options: the parts every spec shares, with the rules that need more than the model."""
    _checked(model, body)
    name = body.get("name", what)
    if not isinstance(name, str) or not name.strip():
        raise SpecError("name: must be a non-empty string")
    graph = body["graph"]
    for nid, node in graph.items():
        if not isinstance(node, Mapping) or not isinstance(node.get("class_type"), str):
            raise SpecError(f"graph[{nid!r}]: a node must be an object with class_type and inputs")
        if "inputs" in node and not isinstance(node["inputs"], Mapping):
            raise SpecError(f"graph[{nid!r}].inputs: must be an object")
    options = body.get("options")
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise SpecError("options: must be an object (the options of POST /api/runs, given to every run)")
    if "name" in options:
        raise SpecError("options.name: each run is named after the sweep and its values; give the sweep a name")
    return name.strip()[:MAX_NAME_CHARS], {str(k): v for k, v in graph.items()}, dict(options)


def _checked(model: type[C], raw: Any) -> C:
    """``raw`` validated by its contract ``model``; SpecError (the field's own text)."""
    try:
        return validate(model, raw)
    except ContractError as exc:
        raise SpecError(exc.message) from None


def _direction(given: str | None, metric: str, where: str) -> str:
    """The direction given, else the known metric's own (METRIC_DIRECTIONS)."""
    direction = given if given is not None else METRIC_DIRECTIONS.get(metric)
    if direction is None:
        raise SpecError(f"{where}.direction: give maximize or minimize for the metric {metric!r}")
    return direction


def parse_objective(raw: Any) -> Objective:
    """``{"metric", "direction"}``; the direction of a known metric may be left out."""
    metric = _checked(ObjectiveBody, raw).metric.strip()
    if not metric:
        raise SpecError(METRIC_TEXT)
    return Objective(metric, _direction(raw.get("direction"), metric, "objective"))


def parse_fixed(raw: Any, graph: Mapping[str, Any], known_inputs: KnownInputs) -> dict[str, Any]:
    """``set``: path -> value on every variant."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise SpecError("set: must be an object {\"<node id>.<input>\": value}")
    out: dict[str, Any] = {}
    for path, value in raw.items():
        node, name = resolve_path(path, graph, f"set[{path!r}]", known_inputs)
        if isinstance(value, Mapping | list):
            raise SpecError(f"set[{path!r}]: must be one value (a number, string or boolean)")
        out[f"{node}.{name}"] = value
    return out


def parse_seeds(raw: Any, options: Mapping[str, Any]) -> tuple[int, ...] | None:
    """``seeds``: N (seeds 0..N-1) or a list of seeds; each variant runs with ``options.seed`` = one."""
    if raw is None:
        return None
    if "seed" in options:
        raise SpecError("give seeds (one variant per seed) or options.seed (every variant), not both")
    if isinstance(raw, list):
        if not raw or len(raw) > MAX_SEEDS:
            raise SpecError(f"seeds: a list of 1 to {MAX_SEEDS} seeds")
        for s in raw:
            _int(s, "seeds", 0, SEED_LIMIT - 1)
        if len(set(raw)) != len(raw):
            raise SpecError("seeds: lists a seed twice")
        return tuple(raw)
    n = _int(raw, "seeds", 1, MAX_SEEDS)
    return tuple(range(n))


def _max_runs(raw: int | None) -> int:
    """``max_runs`` (its range checked by the model), or the default."""
    return SWEEP_DEFAULT_MAX_RUNS if raw is None else raw


def _overlap(params: tuple[Param, ...], fixed: Mapping[str, Any]) -> None:
    both = sorted({p.path for p in params} & set(fixed))
    if both:
        raise SpecError(f"{', '.join(both)}: both varied (parameters) and set; keep one")


def parse_sweep(body: Any, known_inputs: KnownInputs = _no_inputs) -> SweepSpec:
    """Validate a ``POST /api/sweeps`` body; SpecError (400) names the field to fix. A parameter may name any
    literal input of any node, a ComfyUI node's widget included (params.py)."""
    body = with_workflow_objective(body)  # a ComfyUI workflow's sweep may leave out its objective
    name, graph, options = _common(body, SweepSubmit, "sweep")
    mode = body.get("mode", "grid")  # (grid or random: the model's)
    seeds = parse_seeds(body.get("seeds"), options)
    params = parse_params(body.get("parameters"), graph, mode, known_inputs=known_inputs,
                          allow_empty=seeds is not None and mode == "grid")
    fixed = parse_fixed(body.get("set"), graph, known_inputs)
    _overlap(params, fixed)
    objective = parse_objective(body.get("objective"))
    max_runs = _max_runs(body.get("max_runs"))
    samples = None
    random_seed = 0
    if mode == "random":
        if body.get("samples") is None:
            raise SpecError("samples: a random sweep needs the number of points to draw, e.g. 16")
        samples = body["samples"]  # (its range: the model's)
        if body.get("random_seed") is not None:
            random_seed = body["random_seed"]
    else:
        for key in ("samples", "random_seed"):
            if body.get(key) is not None:
                raise SpecError(f"{key}: only a random sweep has {key}; a grid takes every combination")
    spec = SweepSpec(name=name, graph=graph, mode=mode, params=params, seeds=seeds, objective=objective,
                     options=options, fixed=fixed, max_runs=max_runs, samples=samples, random_seed=random_seed)
    n = spec.n_runs
    if n > max_runs:
        if spec.n_points > SWEEP_MAX_RUNS:
            count = f"more than {SWEEP_MAX_RUNS} runs"
        else:
            count = f"{n} runs ({spec.n_points} points" + (f" x {len(seeds)} seeds)" if seeds else ")")
        raise SpecError(f"the sweep would queue {count} and max_runs is {max_runs}: narrow the grid (or draw "
                        f"fewer samples), or raise max_runs (at most {SWEEP_MAX_RUNS})")
    return spec


def parse_pruner(raw: Any, objective: Objective) -> PrunerSpec:
    """``pruner``: a type name or a :class:`~..contracts.sweeps.Pruner` object; its metric defaults to the
    objective's."""
    if raw is None:
        return PrunerSpec("none")
    if isinstance(raw, str):
        raw = {"type": raw}
    pruner = _checked(Pruner, raw)
    kind = pruner.type or "median"
    if kind == "none":
        if set(raw) - {"type"}:
            raise SpecError("pruner: type none takes no other field")
        return PrunerSpec("none")
    metric = (pruner.metric if pruner.metric is not None else objective.metric).strip()
    if not metric:
        raise SpecError("pruner.metric: the metric runs report while they train, e.g. val_loss_step")
    return PrunerSpec(kind, metric, _direction(pruner.direction, metric, "pruner"),
                      n_startup_trials=pruner.n_startup_trials, n_warmup_steps=pruner.n_warmup_steps,
                      interval_steps=pruner.interval_steps)


def parse_sampler(raw: Any) -> SamplerSpec:
    """``sampler``: a type name or a :class:`~..contracts.sweeps.Sampler` object."""
    if raw is None:
        return SamplerSpec()
    sampler = _checked(Sampler, {"type": raw} if isinstance(raw, str) else raw)
    return SamplerSpec(sampler.type or "tpe", sampler.seed)


def parse_study(body: Any, known_inputs: KnownInputs = _no_inputs) -> StudySpec:
    """Validate a ``POST /api/studies`` body; SpecError (400) names the field to fix."""
    name, graph, options = _common(body, StudySubmit, "study")
    params = parse_params(body.get("parameters"), graph, "study", known_inputs=known_inputs)
    fixed = parse_fixed(body.get("set"), graph, known_inputs)
    _overlap(params, fixed)
    objective = parse_objective(body.get("objective"))
    max_runs = _max_runs(body.get("max_runs"))
    n_trials = body["n_trials"]  # (required, its range: the model's)
    if n_trials > max_runs:
        raise SpecError(f"n_trials is {n_trials} and max_runs is {max_runs}: lower n_trials, or raise max_runs "
                        f"(at most {SWEEP_MAX_RUNS})")
    parallel = body.get("parallel", 1)
    return StudySpec(name=name, graph=graph, params=params, n_trials=n_trials, parallel=min(parallel, n_trials),
                     objective=objective, pruner=parse_pruner(body.get("pruner"), objective),
                     sampler=parse_sampler(body.get("sampler")), options=options, fixed=fixed)
