"""The static memory estimate of a graph (docs/memory.md; docs/workers.md, "sharing a card"): what a run on one card of
its device set needs, item by item, when no run of the same graph has a measured peak.

Items (they add up to the total):

* **weights**: 4 B per parameter (and the buffers) of every model the graph puts on the card;
* **training** (a graph that trains): per trainable parameter, the gradient and the optimizer state:
  Adam/AdamW +12 B, SGD with momentum +8 B, plain SGD +4 B, RMSprop +8 B and one more state each for
  momentum and centered;
* **autocast** (bf16/fp16): +2 B per weight for the half-precision copies;
* **activations**: one training step at the graph's batch size, or one evaluation at the evaluation
  node's batch, whichever is larger: measured by stepping the model on PyTorch's meta device
  (:mod:`.meta_sim`); the training figure is what the step holds beyond the weights, gradients and
  optimizer state (the batch, activations saved for backward, the temporaries of backward and of the
  optimizer step), so the items add up to the simulated peak rather than counting at once what is never
  alive at once;
* **autocast gradients** (training in bf16/fp16): +2 B per weight for the gradients of the half-precision
  copies, which CUDA's autocast backward holds beside the float32 ones (on the CPU, where the meta-device
  simulation is checked, they are not seen);
* **allocator**: +30% of the above for the caching allocator;
* **convolution workspaces** (a phase whose model has convolutions): its activations once more, for cuDNN's
  workspaces and the blocks the allocator keeps after them;
* **CUDA libraries**: +72 MiB for their workspaces.

The margins were fitted to the reserved peaks of the first real-GPU run (docs/gpu-check.md).

The models are built by the graph's own builder nodes (``nodes.models``) on the meta device, in a thread
with a time limit: a build that runs over it is abandoned and no estimate is given. Input shapes come from
the data nodes (explicit image_size / seq_len, or a known dataset) and the model's first layer; a default
never decides a size. An estimate that had to skip or guess something is ``rough``, with the reasons (a
model node it cannot build, no input shape, a size the graph does not give, no batch size); the Queue on...
dialog then shows it but leaves the budget field empty. The estimate is never built when the graph has a
measured peak (``measured_peak_exists``).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..constants import (
    BYTES_PER_GB,
    ESTIMATE_ALLOCATOR_FRACTION,
    ESTIMATE_CONV_WORKSPACE_FRACTION,
    ESTIMATE_CUDA_LIBRARIES_MIB,
    ESTIMATE_MAX_MODEL_USES,
    MEMORY_ESTIMATE_TIMEOUT_S,
)
from .estimate_graph import GraphFacts, ModelNode, Use, read_graph

GIB = BYTES_PER_GB
WEIGHT_BYTES = 4
AUTOCAST_COPY_BYTES = 2
AUTOCAST_GRAD_BYTES = 2  # fitted to the first real-GPU run (docs/gpu-check.md): see the module docstring
GRADIENT_BYTES = 4


def training_bytes(optimizer: str, momentum: float = 0.0, centered: bool = False) -> int:
    """Bytes per trainable parameter for training: the gradient plus the optimizer's state."""
    if optimizer in ("adam", "adamw"):
        return GRADIENT_BYTES + 8  # exp_avg, exp_avg_sq
    if optimizer == "sgd_momentum":
        return GRADIENT_BYTES + 4  # momentum_buffer
    if optimizer == "rmsprop":
        return GRADIENT_BYTES + 4 + (4 if momentum > 0 else 0) + (4 if centered else 0)  # square_avg, ...
    return GRADIENT_BYTES  # plain SGD


@dataclass(frozen=True)
class EstimateItem:
    name: str  # weights | training | autocast | activations | autocast_gradients | allocator | ... | cuda_libraries
    bytes: int
    label: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "bytes": self.bytes, "gib": round(self.bytes / GIB, 4), "label": self.label}


@dataclass(frozen=True)
class Estimate:
    """The estimate; ``total_bytes`` None means no estimate (timed out, or nothing could be built)."""

    items: tuple[EstimateItem, ...] = ()
    total_bytes: int | None = None
    rough: bool = False
    reasons: tuple[str, ...] = ()
    elapsed_s: float = 0.0
    built: bool = True  # False: not built (a measured peak exists)

    @property
    def total_gib(self) -> float | None:
        """The total in GiB, rounded up to 0.01 GiB (what a budget field would show)."""
        if self.total_bytes is None:
            return None
        return math.ceil(self.total_bytes / GIB * 100 - 1e-9) / 100

    def to_json(self) -> dict[str, Any]:
        return {"items": [i.to_json() for i in self.items], "total_bytes": self.total_bytes,
                "total_gib": self.total_gib, "rough": self.rough, "reasons": list(self.reasons),
                "elapsed_s": round(self.elapsed_s, 4), "built": self.built}


@dataclass
class _Built:
    model: Any
    params: int
    buffers: int
    trainable: int
    input_shape: list[int] | None
    task: str | None


def _first_layer_shape(layers: list[dict[str, Any]]) -> list[int] | None:
    """The per-sample input a layer list takes when its first layer says so (Linear: its features)."""
    for layer in layers:
        if layer["type"] == "Flatten":
            continue
        if layer["type"] == "Linear":
            return [int(layer["in_features"])]
        return None
    return None


@dataclass
class _Work:
    facts: GraphFacts
    built: dict[str, _Built | None] = field(default_factory=dict)
    sims: dict[tuple[Any, ...], int] = field(default_factory=dict)  # one simulation per distinct phase
    outputs: dict[tuple[Any, ...], list[int]] = field(default_factory=dict)  # per-sample output shapes

    def note(self, reason: str | None) -> None:
        self.facts.note(reason)

    def build(self, ref: ModelNode) -> _Built | None:
        """The model of a builder node on the meta device, sized as the node sizes it."""
        if ref.node_id in self.built:
            return self.built[ref.node_id]
        import torch

        from ..nodes import NODE_CLASS_MAPPINGS, models

        data = ref.data
        info = dict(data.info) if data is not None and data.info is not None else None
        cls = NODE_CLASS_MAPPINGS[ref.class_type]
        result: _Built | None = None
        try:
            with torch.device("meta"):
                (model,) = cls().build(**ref.inputs, **({"dataset_info": info} if info else {}))
        except (TypeError, ValueError) as exc:
            why = data.unknown if data is not None and data.unknown else str(exc)
            self.note(f"model node {ref.node_id} ({ref.class_type}) cannot be sized here ({why}), so its size is "
                      f"not counted")
        else:
            if data is not None and info is not None:
                self.note(data.guess)  # the model is sized from a default size
            spec = models.spec_of(model) or {}
            shape = spec.get("input_shape") or _first_layer_shape(models.layers_of(spec))
            result = _Built(model, sum(p.numel() for p in model.parameters()),
                            sum(b.numel() * b.element_size() for b in model.buffers()),
                            sum(p.numel() for p in model.parameters() if p.requires_grad),
                            [int(d) for d in shape] if shape else None, spec.get("task"))
        self.built[ref.node_id] = result
        return result

    def fresh(self, ref: ModelNode) -> Any:
        """Another meta copy of a built model (a step changes gradients and state)."""
        import copy

        return copy.deepcopy(self.built[ref.node_id].model)  # type: ignore[union-attr]

    def phase(self, use: Use, built: _Built) -> int | None:
        """The most the use holds on the card beyond its model's weights, simulated on the meta device
        (None: skipped, with the reason noted)."""
        from . import meta_sim

        if use.batch is None:
            return None
        data_shape = use.data.info.get("input_shape") if use.data is not None and use.data.info else None
        if data_shape:
            self.note(use.data.guess)  # type: ignore[union-attr]
        shape = list(data_shape) if data_shape else built.input_shape
        if shape is None:
            where = use.data.unknown if use.data is not None and use.data.unknown else "the graph gives none"
            self.note(f"node {use.node_id}: no input shape for model node {use.model.node_id} ({where}, and the "  # type: ignore[union-attr]
                      f"model's first layer does not fix it), so its activations are not counted")
            return None
        task = built.task or (use.data.info.get("task") if use.data is not None and use.data.info else None)
        key = (use.model.node_id, use.kind, use.batch, tuple(shape), use.precision,  # type: ignore[union-attr]
               tuple(sorted(use.loss.items())), tuple(sorted(use.optimizer.items())) if use.kind == "train" else (),
               use.grad_clip_norm if use.kind == "train" else 0.0)
        try:
            if key not in self.sims:
                out = self.outputs.get((use.model.node_id, tuple(shape), use.precision))  # type: ignore[union-attr]
                if out is None:
                    out = meta_sim.sample_output_shape(built.model, shape, use.precision)
                    self.outputs[(use.model.node_id, tuple(shape), use.precision)] = out  # type: ignore[union-attr]
                if use.kind == "train":
                    mem = meta_sim.simulate_train(
                        self.fresh(use.model), shape, use.batch, optimizer=use.optimizer, loss=use.loss,  # type: ignore[arg-type]
                        task=task, precision=use.precision, grad_clip_norm=use.grad_clip_norm, out_shape=out)
                else:
                    mem = meta_sim.simulate_eval(self.fresh(use.model), shape, use.batch, loss=use.loss,  # type: ignore[arg-type]
                                                 task=task, precision=use.precision, out_shape=out)
                self.sims[key] = mem.beyond_weights
            held = self.sims[key]
        except Exception as exc:  # noqa: BLE001 - a model the meta device cannot run is skipped, said so
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            self.note(f"node {use.node_id}: the model does not run on input {shape} on the meta device ({first}), "
                      f"so its activations are not counted")
            return None
        if use.kind == "train":
            return held
        if use.resident == use.node_id and use.optimizer:  # validation inside a TrainingLoop: its state lives
            opt = str(use.optimizer.get("name", "adam"))
            held += built.trainable * (training_bytes(opt, float(use.optimizer.get("momentum", 0.0)))
                                       - GRADIENT_BYTES)
        return held


def _has_convolutions(model: Any) -> bool:
    import torch

    return any(isinstance(m, torch.nn.modules.conv._ConvNd) for m in model.modules())


def _items(facts: GraphFacts) -> tuple[list[EstimateItem], bool]:
    """The items; the activations item is what the largest phase holds beyond the formula items, so the
    total is at least the simulated peak of every phase and never counts twice what is alive once."""
    work = _Work(facts)
    resident: dict[str, _Built] = {}
    training: tuple[int, str] = (0, "")
    autocast: tuple[int, str] = (0, "")
    half_grads: tuple[int, str] = (0, "")
    phase: tuple[int, str] = (0, "")
    conv_phase = False  # whether the largest phase's model has convolutions
    any_model = False
    for use in facts.uses:
        built = work.build(use.model) if use.model is not None else None
        if built is None:
            continue
        any_model = True
        resident.setdefault(use.resident, built)
        if use.kind == "train":
            opt = str(use.optimizer.get("name", "adam"))
            per = training_bytes(opt, float(use.optimizer.get("momentum", 0.0)))
            if built.trainable * per > training[0]:
                training = (built.trainable * per, f"{built.trainable:,} trainable parameters x {per} B (gradients "
                                                   f"and {opt} state, node {use.node_id})")
        if use.precision in ("bf16", "fp16") and use.kind == "train" and built.params * AUTOCAST_GRAD_BYTES > half_grads[0]:
            half_grads = (built.params * AUTOCAST_GRAD_BYTES,
                          f"{built.params:,} weights x {AUTOCAST_GRAD_BYTES} B ({use.precision} gradients of the autocast "
                          f"copies on CUDA, node {use.node_id})")
        if use.precision in ("bf16", "fp16") and built.params * AUTOCAST_COPY_BYTES > autocast[0]:
            autocast = (built.params * AUTOCAST_COPY_BYTES,
                        f"{built.params:,} weights x {AUTOCAST_COPY_BYTES} B ({use.precision} autocast copies, "
                        f"node {use.node_id})")
        held = work.phase(use, built)
        if held is not None and (held > phase[0] or not phase[1]):
            phase = (held, use.label)
            conv_phase = _has_convolutions(built.model)
    items: list[EstimateItem] = []
    if not any_model:
        return items, False
    params = sum(b.params for b in resident.values())
    buffers = sum(b.buffers for b in resident.values())
    where = ", ".join(f"node {n}" for n in resident)
    label = f"{params:,} parameters x {WEIGHT_BYTES} B" + (f" + {buffers:,} B of buffers" if buffers else "")
    items.append(EstimateItem("weights", params * WEIGHT_BYTES + buffers, f"{label} ({where})"))
    if training[1]:
        items.append(EstimateItem("training", *training))
    if autocast[1]:
        items.append(EstimateItem("autocast", *autocast))
    rest = 0
    if phase[1]:
        rest = max(0, phase[0] - training[0] - autocast[0])
        items.append(EstimateItem("activations", rest, f"{phase[1]}: the batch, activations and temporaries "
                                                       f"beyond the items above (meta-device simulation)"))
    else:
        items.append(EstimateItem("activations", 0, "not counted (see the reasons)"))
    if half_grads[1]:
        items.append(EstimateItem("autocast_gradients", *half_grads))
    subtotal = sum(i.bytes for i in items)
    items.append(EstimateItem("allocator", int(round(subtotal * ESTIMATE_ALLOCATOR_FRACTION)),
                              f"+{ESTIMATE_ALLOCATOR_FRACTION:.0%} for the caching allocator"))
    if conv_phase and phase[1]:
        items.append(EstimateItem("convolution_workspaces", int(round(rest * ESTIMATE_CONV_WORKSPACE_FRACTION)),
                                  f"+{ESTIMATE_CONV_WORKSPACE_FRACTION:.0%} of the activations for cuDNN's workspaces "
                                  f"(a model with convolutions)"))
    items.append(EstimateItem("cuda_libraries", ESTIMATE_CUDA_LIBRARIES_MIB * 1024**2,
                              f"+{ESTIMATE_CUDA_LIBRARIES_MIB} MiB for the CUDA libraries' workspaces"))
    return items, True


def _too_large(facts: GraphFacts) -> Estimate | None:
    """The answer for a graph that runs a model in more than ESTIMATE_MAX_MODEL_USES places (each is a
    meta-device build): bounded, said so, and nothing built (not even torch imported)."""
    if len(facts.uses) <= ESTIMATE_MAX_MODEL_USES:
        return None
    return Estimate((), None, True, (f"too large to estimate: the graph runs a model in {len(facts.uses)} places "
                                     f"(training steps and evaluations); the estimate builds at most "
                                     f"{ESTIMATE_MAX_MODEL_USES}",))


def _compute(graph: Mapping[str, Any]) -> Estimate:
    facts = read_graph(graph)
    too_large = _too_large(facts)
    if too_large is not None:
        return too_large
    if not facts.uses:
        facts.note("the graph puts no model on the card (no TrainingLoop, Evaluate or Predict with a model)")
    items, any_model = _items(facts)
    if not any_model:
        return Estimate((), None, True, tuple(facts.reasons))
    return Estimate(tuple(items), sum(i.bytes for i in items), bool(facts.reasons), tuple(facts.reasons))


def estimate_graph(graph: Mapping[str, Any], *, timeout_s: float = MEMORY_ESTIMATE_TIMEOUT_S,
                   measured_peak_exists: bool = False) -> Estimate:
    """The static estimate of ``graph`` (see the module docstring), built in a thread with a time limit
    (the first call in a process imports torch first, outside the limit).

    Raises ValueError for a graph that is not API-format. ``measured_peak_exists``: the graph has a
    measured peak, so nothing is built (the suggestion is the measured one)."""
    if measured_peak_exists:
        return Estimate(built=False, reasons=("not built: the graph has a measured peak",))
    if not isinstance(graph, Mapping):
        raise ValueError("the graph must be an API-format object {\"<id>\": {\"class_type\", \"inputs\"}}")
    too_large = _too_large(read_graph(graph))  # linear; before torch, whose import holds the GIL for long
    if too_large is not None:
        return too_large
    # Imported here, so that the time limit covers the build and not the imports (torch, the nodes and what
    # they import: seconds from a cold disk, which once timed out the first estimate on a fresh GPU machine).
    import torch  # noqa: F401

    from ..nodes import models  # noqa: F401
    from . import meta_sim  # noqa: F401

    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["result"] = _compute(graph)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc

    t0 = time.perf_counter()
    thread = threading.Thread(target=work, name="xpufleet-estimate", daemon=True)
    thread.start()
    thread.join(timeout_s)
    elapsed = time.perf_counter() - t0
    if thread.is_alive():
        return Estimate(reasons=(f"building the graph's models on the meta device took longer than {timeout_s:g} s, "
                                 f"so there is no estimate",), rough=True, elapsed_s=elapsed)
    if "error" in box:
        raise box["error"]
    result: Estimate = box["result"]
    return Estimate(result.items, result.total_bytes, result.rough, result.reasons, elapsed)


__all__ = ["Estimate", "EstimateItem", "estimate_graph", "training_bytes"]
