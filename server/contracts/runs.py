"""The run contracts: the body of ``POST /api/runs`` (also ``POST /api/estimates``), a cancel, and the
run as the API answers it (docs/sidecar.md, docs/limits.md).

The field checks and their 400 texts live on the fields (:func:`~.base.refuse`); the graph's size and shape
(:mod:`.graph_shape`) and the target's cross-field rules (:mod:`.run_target`) are the rule functions the
validators call. Status and source names come from ``constants.py``.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, PrivateAttr, field_validator, model_validator

from ...constants import (
    MAX_DEVICE_SET,
    MAX_FIELD_NAME_CHARS,
    MAX_GRAPH_NODES,
    MAX_GRAPH_STRING_CHARS,
    MAX_NODE_ID_CHARS,
    MAX_RUN_NAME_CHARS,
    RUN_KIND_GRAPH,
    RUN_KINDS,
    RUN_SOURCES,
    RUN_STATUSES,
)
from ..scheduling.routing import MEMORY_SOURCES, RunTarget, TargetError
from .base import Contract, ContractError, refuse, ruled
from .graph_shape import check_graph_shape
from .run_target import TARGET_FIELDS, parse_target

RunStatus = Literal[RUN_STATUSES]  # type: ignore[valid-type]  # one list: constants.RUN_STATUSES
RunSource = Literal[RUN_SOURCES]  # type: ignore[valid-type]
RunKind = Literal[RUN_KINDS]  # type: ignore[valid-type]
MemorySource = Literal[MEMORY_SOURCES]  # type: ignore[valid-type]
RECORD_MODES = ("upload",)  # record_outputs: true / false / "upload" (docs/workers.md)

Devices = Annotated[list[str], Field(min_length=1, max_length=MAX_DEVICE_SET)]
WorkerName = Annotated[str, Field(min_length=1, max_length=64)]


class Node(Contract):
    """One node of a graph in ComfyUI's API format."""

    model_config = {"extra": "allow", "json_schema_extra": {"propertyNames": {"maxLength": MAX_FIELD_NAME_CHARS}}}
    class_type: str = Field(min_length=1, max_length=MAX_FIELD_NAME_CHARS,
                            description="a node type this server (or the target worker) knows")
    inputs: dict[Annotated[str, Field(max_length=MAX_FIELD_NAME_CHARS)], Any] = Field(
        default_factory=dict, description="literal values, or links [node_id, output_index]")


GRAPH_LIMITS = (f"ComfyUI API-format graph: at most {MAX_GRAPH_NODES} nodes (413 beyond), ids of at most "
                f"{MAX_NODE_ID_CHARS} characters, names of at most {MAX_FIELD_NAME_CHARS}, strings of at most "
                f"{MAX_GRAPH_STRING_CHARS}; every body nests at most 64 levels")


def _graph(value: Any) -> dict[str, Any]:
    check_graph_shape(value)  # one linear pass (a 10,000-node graph is not validated node by node)
    return dict(value)


# The graph: its shape checked by the rule function, documented as nodes (the Node model's schema).
Graph = Annotated[dict[str, Any], PlainValidator(
    _graph, json_schema_input_type=dict[Annotated[str, Field(max_length=MAX_NODE_ID_CHARS)], Node]), Field(
    description=GRAPH_LIMITS, json_schema_extra={"minProperties": 1, "maxProperties": MAX_GRAPH_NODES})]


class SpreadEntry(Contract):
    """One worker of a ddp run across workers: its name and its cards."""

    worker: WorkerName
    devices: Devices


class Target(Contract):
    """``options.target`` as an object (a string names a worker). Validated by
    :func:`~.run_target.parse_target`, whose cross-field rules need ``options.device`` too."""

    worker: WorkerName | None = Field(None, description="\"local\" (default), \"any\" or a worker name")
    devices: Devices | None = Field(None, description="a device set: the run takes every slot at once")
    memory_gib: float | None = Field(None, gt=0, le=1e6, description="budget per card (GiB) on cards shared by memory")
    memory_source: MemorySource | None = Field(  # type: ignore[valid-type]
        None, description="estimate: the dialog's unmodified static estimate (raised to a larger measured peak + "
                          "20%); user (default): typed, never changed")
    wait: bool | None = Field(None, description="when the budget does not fit now: true waits, false rejects "
                                                "(default: a named worker rejects, any waits)")
    pool: str | None = Field(None, description="a one-shot worker pool: an idle instance takes the run (it waits "
                                               "while none is idle)")
    spread: list[SpreadEntry] | None = Field(
        None, min_length=2, max_length=MAX_DEVICE_SET,
        description="ddp across workers (alone: no other target field): one entry per worker, ranks numbered in "
                    "entry order; the graph trains with strategy ddp")


assert tuple(Target.model_fields) == TARGET_FIELDS  # the rule function's "known" list is the model's fields


class RunOptions(Contract):
    """``options`` of a run."""

    name: Annotated[str | None, refuse("options.name: must be a string")] = Field(
        None, description=f"at most {MAX_RUN_NAME_CHARS} characters (a longer name is refused)")
    seed: Annotated[int | None, Field(ge=0, lt=2**63),
                    refuse("options.seed: must be an integer between 0 and 2^63-1")] = Field(
        None, description="overrides every node's seed")
    deterministic: Annotated[bool | None, refuse("options.deterministic: must be true or false")] = None
    record_outputs: Annotated[bool | Literal["upload"] | None, refuse(
        "options.record_outputs: must be true (kept on the worker), \"upload\" (also copied to this server when "
        "the run ends) or false")] = Field(
        None, description="record each node's outputs (docs/workers.md): true = kept where the run runs, "
                          "\"upload\" = also copied to this server at the end; refused for a pool target")
    device: Annotated[Any, ruled(str | None)] = Field(None, description="auto, cpu, cuda, cuda:N, xpu:N, mps (no set)")
    target: Annotated[Any, ruled(str | Target | None)] = Field(None, description="a worker name, or an object")
    _target: RunTarget | None = PrivateAttr(None)  # (a default_factory would cost an inspect() per body)
    shape_texts = ("options: must be an object", "options: unknown field(s) {unknown}; known: {known}")

    @field_validator("name")
    @classmethod
    def _name(cls, name: str | None) -> str | None:
        if name is None:
            return None
        name = name.strip()
        if len(name) > MAX_RUN_NAME_CHARS:
            raise ContractError(f"options.name: {len(name)} characters; at most {MAX_RUN_NAME_CHARS}")
        return name or None

    @model_validator(mode="after")
    def _route(self) -> RunOptions:
        try:
            target = parse_target({"target": self.target, "device": self.device})
        except TargetError as exc:
            raise ContractError(str(exc)) from None
        if self.record_outputs and target.pool is not None:
            raise ContractError("options.record_outputs is off for a one-shot pool (options.target.pool): its "
                                "agent exits when the run ends, so nothing could read the outputs it keeps; leave "
                                "it out")
        self._target = target
        return self

    @property
    def run_target(self) -> RunTarget:
        """The validated target (``parse_target``'s answer)."""
        assert self._target is not None  # set by the after validator of every instance
        return self._target


EXAMPLE_GRAPH: dict[str, Any] = {  # a small real graph (iris, an MLP, one epoch, an evaluation)
    "1": {"class_type": "XPUDataset", "inputs": {"name": "iris", "val_split": 0.2, "seed": 0, "normalize": "standard"}},
    "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["1", 0], "batch_size": 16, "shuffle": True,
                                                    "num_workers": 0, "drop_last": False}},
    "3": {"class_type": "XPUMLP", "inputs": {"hidden": "16", "activation": "relu", "dropout": 0.0, "seed": 0,
                                             "dataset_info": ["1", 2]}},
    "4": {"class_type": "XPUOptimizer", "inputs": {"name": "adam", "lr": 0.01, "weight_decay": 0.0, "momentum": 0.9}},
    "5": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}},
    "6": {"class_type": "XPUTrainingLoop", "inputs": {"model": ["3", 0], "dataloader": ["2", 0], "optimizer": ["4", 0],
                                                      "loss": ["5", 0], "epochs": 1, "max_steps": 0, "device": "auto",
                                                      "precision": "fp32", "tensorboard": False, "strategy": "single"}},
    "7": {"class_type": "XPUEvaluate", "inputs": {"model": ["6", 0], "dataloader": ["2", 0], "device": "auto",
                                                  "precision": "fp32"}},
}


class RunSubmit(Contract):
    """The body of ``POST /api/runs``: a graph and its options."""

    model_config = {"json_schema_extra": {"example": {"graph": EXAMPLE_GRAPH, "options": {"name": "iris", "seed": 1}}}}
    graph: Graph
    options: RunOptions | None = None
    shape_texts = ("the body must be a JSON object {\"graph\": {...}, \"options\": {...}}",
                   "unknown field(s) {unknown}: the body has \"graph\" and \"options\"")
    missing_texts = {"graph": "graph: missing; send the graph in ComfyUI's API format as \"graph\""}


assert set(RunSubmit.model_fields) == {"graph", "options"}  # the unknown-field text names them


class EstimateRequest(RunSubmit):
    """The body of ``POST /api/estimates``: a run's body (its target says how many cards, which cards)."""

    missing_texts = {"graph": "graph: missing; send {\"graph\": {...}, \"options\": {...}} as for POST /api/runs"}


class Cancel(Contract):
    """The optional body of a cancel (a run's, a sweep's, a study's)."""

    reason: Annotated[str | None, Field(max_length=500),
                      refuse("reason: must be a string of at most 500 characters")] = None
    shape_texts = ("the body must be a JSON object like {\"reason\": \"...\"} (or empty)",
                   "unknown field(s) {unknown}: the body may have \"reason\"")


class RunQueued(Contract):
    """The answer to ``POST /api/runs``."""

    run_id: str
    status: RunStatus  # type: ignore[valid-type]


class Run(Contract):
    """A run as ``GET /api/runs`` and ``GET /api/runs/{run_id}`` answer it."""

    model_config = {"extra": "allow"}
    id: str
    name: str | None = None
    status: RunStatus  # type: ignore[valid-type]
    target: str | None = None
    placement: str | None = None
    worker_id: str | None
    devices: list[str]
    requested: list[str] | None = None
    queue_key: str | None
    budget_gib: float | None
    budget_source: str | None
    error: str | None
    waiting_reason: str | None
    warnings: list[Any]
    execution_facts: dict[str, Any]
    peak_memory: dict[str, Any] | None
    final_metrics: dict[str, Any] | None
    cursor: int | None = None
    objective: dict[str, Any] | None = Field(None, description="the row's headline: metric, value, direction "
                                             "(val_accuracy first, then other accuracies, then losses; "
                                             "server/sidecar/objective.py)")
    created_at: float | None = None
    started_at: float | None = None
    finished_at: float | None = None
    graph: dict[str, Any] | None = None
    source: RunSource = Field("api", description="api: POST /api/runs (CLI, Queue on..., sweeps, "  # type: ignore[valid-type]
                              "studies); canvas: ComfyUI's own Run, recorded by the plugin")
    kind: RunKind = Field(RUN_KIND_GRAPH, description="graph: a graph of the fleet's nodes, run by its "  # type: ignore[valid-type]
                          "executor; comfyui: a workflow holding other nodes, run by a ComfyUI on the card "
                          "(docs/comfyui.md)")
    budget: dict[str, Any] | None = Field(None, description="memory budget per card: gib, source "
                                          "(user|measured|estimate), from_run (the run whose peak it is), peak_gib, "
                                          "peak_source, declared_gib and reason (a raise), label (the Runs panel's "
                                          "budget column)")
    graph_key: str | None = Field(None, description="the runtime-graph key peaks are filed under")
    n_cards: int | None = None
    memory_peak: dict[str, Any] | None = Field(None, description="a finished run's per-card figure: gib, source "
                                               "(cuda peak | mps driver-held at the end | simulated tensor bytes), "
                                               "label")


class Event(Contract):
    """One run event (docs/events.md)."""

    cursor: int = Field(ge=1)
    type: str
    payload: dict[str, Any]
    ts: float
