"""Training nodes (docs/nodes.md): Optimizer, LR scheduler, Loss, TrainingLoop and Evaluate."""

from __future__ import annotations

import math
from typing import Any

from ..constants import CANVAS_CURVE_POINTS
from . import device as devmod
from . import hostmode, paths, runtime
from . import types as T
from .contract import Node, float_widget, inputs_of, int_widget, socket, widget
from .models import resolve_seed, spec_of
from .specs import LossSpec, OptimizerSpec, SchedulerSpec

_DEVICE_INPUT = widget(devmod.DEVICE_CHOICES, "auto", "auto follows the run's first device")
_PRECISION_INPUT = widget(T.PRECISION_CHOICES, "fp32", "autocast precision (fp16 on a CPU runs bf16)")


def node_label(name: str, class_type: str) -> str:
    """How messages name the running node: ``8 (XPUTrainingLoop)`` in a run or in ComfyUI, else its
    plain name."""
    ctx = runtime.current()
    if ctx is not None and ctx.node_id:
        return f"{ctx.node_id} ({ctx.class_type or class_type})"
    hosted = runtime.hosted_node_id() if ctx is None else None
    return f"{hosted} ({class_type})" if hosted else name


def _format_metrics(metrics: dict[str, Any]) -> str:
    parts = []
    for key, label in (("final_train_loss", "train_loss"), ("final_val_loss", "val_loss"),
                       ("final_val_accuracy", "val_accuracy"), ("loss", "loss"), ("accuracy", "accuracy")):
        v = metrics.get(key)
        if isinstance(v, (int, float)):
            parts.append(f"{label} {v:.4f}")
    for key in ("epochs_completed", "steps", "n_samples"):
        if key in metrics:
            parts.append(f"{key} {metrics[key]}")
    return ", ".join(parts)


class XPUOptimizer(Node, category=T.CATEGORY_TRAINING, function="make", display="Optimizer",
                   returns={"optimizer": T.OPTIMIZER}):
    """Optimizer node: which optimizer and its hyper-parameters (built by the TrainingLoop)."""

    DESCRIPTION = ("Chooses the optimizer: SGD (plain or with momentum), Adam, AdamW or RMSprop. The TrainingLoop "
                   "builds it over the model's parameters.")
    REQUIRED, OPTIONAL = inputs_of(OptimizerSpec, required=("name", "lr", "weight_decay", "momentum"))

    def make(self, name: str = "adam", lr: float = 1e-3, weight_decay: float = 0.0, momentum: float = 0.9,
             nesterov: bool = False, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> tuple[Any]:
        return (OptimizerSpec(name=name, lr=float(lr), weight_decay=float(weight_decay), momentum=float(momentum),
                              nesterov=bool(nesterov), beta1=float(beta1), beta2=float(beta2), eps=float(eps)),)


class XPULRScheduler(Node, category=T.CATEGORY_TRAINING, function="make", display="LR Scheduler",
                     returns={"lr_scheduler": T.LR_SCHEDULER}):
    """LR scheduler node: step, cosine, exponential, one-cycle, or none."""

    DESCRIPTION = ("A learning-rate schedule for the TrainingLoop. interval: step the schedule once per epoch or "
                   "once per optimizer step (one-cycle is always per step). cosine t_max 0 = the whole run; "
                   "onecycle max_lr 0 = 10 x the optimizer's lr.")
    REQUIRED, OPTIONAL = inputs_of(SchedulerSpec, required=("name", "interval"))

    def make(self, name: str = "cosine", interval: str = "epoch", step_size: int = 10, gamma: float = 0.1,
             t_max: int = 0, eta_min: float = 0.0, max_lr: float = 0.0, pct_start: float = 0.3) -> tuple[Any]:
        return (SchedulerSpec(name=name, interval=interval, step_size=int(step_size), gamma=float(gamma),
                              t_max=int(t_max), eta_min=float(eta_min), max_lr=float(max_lr),
                              pct_start=float(pct_start)),)


class XPULoss(Node, category=T.CATEGORY_TRAINING, function="make", display="Loss", returns={"loss": T.LOSS}):
    """Loss node."""

    DESCRIPTION = ("The loss: cross_entropy (class labels), bce_with_logits (binary / multi-label), mse, l1, "
                   "smooth_l1 (regression; integer labels are one-hot encoded against multi-column outputs).")
    REQUIRED, OPTIONAL = inputs_of(LossSpec, required=("name",))

    def make(self, name: str = "cross_entropy", label_smoothing: float = 0.0) -> tuple[Any]:
        return (LossSpec(name=name, label_smoothing=float(label_smoothing)),)


class XPUTrainingLoop(Node, category=T.CATEGORY_TRAINING, function="train", display="Training Loop",
                      returns={"model": T.MODEL, "metrics": T.METRICS}, output=True):
    """TrainingLoop node: trains a copy of the model and outputs it with its metrics; an output node:
    training is the job (checkpoints, TensorBoard, metrics), so a graph that ends at the TrainingLoop runs,
    in ComfyUI's executor as in ours."""

    DESCRIPTION = (
        "Trains the model: epochs (or max_steps optimizer steps), gradient accumulation and clipping, fp32/bf16/"
        "fp16 autocast, an LR schedule, checkpoints every N epochs / steps and on stop, TensorBoard event files, "
        "and metrics train_loss, train_loss_batch, val_loss, val_accuracy, val_loss_step. strategy ddp (Advanced) "
        "trains one model on several cards of a worker run; elsewhere it falls back to single."
    )
    REQUIRED = {
        "model": socket(T.MODEL, "the model to train (a copy is trained; the input stays as built)"),
        "dataloader": socket(T.DATALOADER, "training batches"),
        "optimizer": socket(T.OPTIMIZER, "an Optimizer node"),
        "loss": socket(T.LOSS, "a Loss node"),
        "epochs": int_widget(10, 1, 1_000_000, "passes over the dataloader"),
        "max_steps": int_widget(0, 0, 1 << 40, "stop after this many optimizer steps (0 = no limit)"),
        "device": _DEVICE_INPUT,
        "precision": _PRECISION_INPUT,
    }
    OPTIONAL = {
        "val_dataloader": socket(T.DATALOADER, "validated after every epoch: val_loss, val_accuracy"),
        "lr_scheduler": socket(T.LR_SCHEDULER, "an LR Scheduler node"),
        "accumulate_steps": int_widget(1, 1, 4096, "batches whose gradients make one optimizer step"),
        "grad_clip_norm": float_widget(0.0, 0.0, 1e6, 0.1, "clip the gradient norm (0 = off)"),
        "checkpoint_every": int_widget(0, 0, 1_000_000, "write a checkpoint every N epochs (0 = off)"),
        "checkpoint_every_steps": int_widget(0, 0, 1 << 40, "write a checkpoint every N optimizer steps (0 = off)"),
        "val_every_steps": int_widget(0, 0, 1 << 40, "also validate every N optimizer steps (val_loss_step)"),
        "seed": int_widget(0, -1, 2**31 - 1,
                           "seed of shuffling and dropout (-1 = unseeded); a run's seed overrides it"),
        "tensorboard": widget("BOOLEAN", True, "write TensorBoard event files"),
        "strategy": widget(T.STRATEGY_CHOICES, "single", "ddp: one model on every card of a worker run",
                           advanced=True),
        "resume_from": widget("STRING", "", "checkpoint to continue from (an interrupted epoch restarts)",
                              advanced=True),
        "checkpoint_dir": widget("STRING", "", "'' = the run directory's checkpoints folder; else a folder inside the "
                                 "run directory (outside a run: inside the outputs folder); no '..', not absolute",
                                 advanced=True),
    }

    @classmethod
    def IS_CHANGED(cls, seed: int = 0, resume_from: str = "", **_: Any) -> Any:
        """The caching rule (see nodes/hostmode.py): seeded and unchanged = ComfyUI may reuse the
        trained model; seed -1, or a resume_from checkpoint that changed on disk, trains again."""
        return hostmode.combine(hostmode.seed_rerun_key(seed), hostmode.file_key(resume_from))

    @classmethod
    def VALIDATE_INPUTS(cls, checkpoint_dir: Any = None, resume_from: Any = None) -> bool | str:
        """A checkpoint_dir that cannot stay inside the run directory, or a resume_from outside the folders
        graphs may read (nodes/paths.py), is refused before anything runs."""
        verdict = paths.path_input_check("checkpoint_dir", checkpoint_dir, "checkpoints go inside the run "
                                         "directory (outside a run: the outputs folder): give a relative folder "
                                         "name", empty_ok=True)
        return paths.read_input_check("resume_from", resume_from) if verdict is True else verdict

    def train(self, model: Any, dataloader: Any, optimizer: OptimizerSpec, loss: LossSpec, epochs: int = 10,
              max_steps: int = 0, device: str = "auto", precision: str = "fp32", val_dataloader: Any = None,
              lr_scheduler: SchedulerSpec | None = None, accumulate_steps: int = 1, grad_clip_norm: float = 0.0,
              checkpoint_every: int = 0, checkpoint_every_steps: int = 0, val_every_steps: int = 0, seed: int = 0,
              tensorboard: bool = True, strategy: str = "single", resume_from: str = "",
              checkpoint_dir: str = "") -> dict[str, Any]:
        from .trainer import TrainConfig
        from .trainer import train as run_training

        label = node_label("TrainingLoop", T.TRAINING_LOOP_NODE)
        cfg = TrainConfig(
            epochs=int(epochs), max_steps=int(max_steps), accumulate_steps=int(accumulate_steps),
            grad_clip_norm=float(grad_clip_norm), precision=precision, device=device,
            checkpoint_every=int(checkpoint_every), checkpoint_every_steps=int(checkpoint_every_steps),
            val_every_steps=int(val_every_steps), seed=resolve_seed(seed), tensorboard=bool(tensorboard),
            strategy=strategy, resume_from=str(resume_from or "").strip(),
            checkpoint_dir=str(checkpoint_dir or "").strip(), node_label=label,
        )
        with runtime.collect_warnings() as warnings:
            trained, metrics = run_training(model, dataloader, optimizer, loss, cfg, val_dataloader, lr_scheduler)
        text = _format_metrics(metrics)
        runtime.info(f"{label}: {text}")
        shown = [text] + [f"warning ({w['kind']}): {w['message']}" for w in warnings]
        return {"ui": {"text": shown, "metrics": [ui_metrics(metrics)], "warnings": warnings, "curve": [ui_curve(metrics)]},
                "result": (trained, metrics)}


# What the TrainingLoop shows on the canvas (and in ComfyUI's /history): the scalars, not the histories.
_UI_METRIC_KEYS = ("strategy", "world_size", "device", "precision", "epochs_completed", "steps",
                   "effective_batch_size", "final_train_loss", "final_val_loss", "final_val_accuracy",
                   "duration_s", "samples_per_s", "checkpoints", "tensorboard_dir")


def _json_safe(value: Any) -> Any:
    """NaN/inf become None: ComfyUI's /history is JSON, which has no NaN."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def ui_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """The JSON-safe summary of a TrainingLoop's or Evaluate's metrics for its ``ui`` output."""
    keys = _UI_METRIC_KEYS if "final_train_loss" in metrics else tuple(metrics)
    return {k: _json_safe(metrics[k]) for k in keys if k in metrics}


def ui_curve(metrics: dict[str, Any], points: int | None = None) -> dict[str, list[list[float]]]:
    """The TrainingLoop's loss curves for the node's chart on the canvas: ``[step, value]`` pairs of the
    batch loss and of every validation, each thinned to at most ``points`` (first and last kept)."""
    limit = points or CANVAS_CURVE_POINTS
    out = {}
    for key in ("train_loss_batch", "val_loss_step"):
        series = [[int(s), float(v)] for s, v in metrics.get(key) or [] if v is not None and math.isfinite(v)]
        if len(series) > limit:
            stride = (len(series) - 1) / (limit - 1)
            series = [series[round(i * stride)] for i in range(limit)]
        out[key] = series
    return out


def default_loss_for(model: Any, loader: Any) -> LossSpec:
    """cross_entropy for classification models/datasets, mse otherwise."""
    spec = spec_of(model) or {}
    task = spec.get("task") or (getattr(getattr(loader, "dataset", None), "info", {}) or {}).get("task")
    return LossSpec("cross_entropy" if task == "classification" else "mse")


class XPUEvaluate(Node, category=T.CATEGORY_TRAINING, function="evaluate", display="Evaluate",
                  returns={"metrics": T.METRICS}, output=True):
    """Evaluate node: loss and accuracy of a model on a dataloader (an output node)."""

    DESCRIPTION = "Loss and accuracy of a model on a dataloader (e.g. the validation split)."
    REQUIRED = {
        "model": socket(T.MODEL, "the model to evaluate"),
        "dataloader": socket(T.DATALOADER, "the data to evaluate on (e.g. the val split)"),
        "device": _DEVICE_INPUT,
        "precision": _PRECISION_INPUT,
    }
    OPTIONAL = {"loss": socket(T.LOSS, "default: cross_entropy for classifiers, else mse")}

    def evaluate(self, model: Any, dataloader: Any, device: str = "auto", precision: str = "fp32",
                 loss: LossSpec | None = None) -> dict[str, Any]:
        from .trainer import evaluate as run_eval
        from .trainer import resolve_precision

        label = node_label("Evaluate", T.EVALUATE_NODE)
        dev = devmod.torch_device(device, label)
        prec = resolve_precision(precision, dev, label)
        loss_spec = loss if loss is not None else default_loss_for(model, dataloader)
        moved = model.to(dev)
        with hostmode.inference():
            result = run_eval(moved, dataloader, loss_spec.build(), dev, prec)
        metrics = {"loss": result["loss"], "accuracy": result["accuracy"], "n_samples": result["n_samples"],
                   "loss_name": loss_spec.name}
        for name in ("loss", "accuracy"):
            if metrics[name] is not None:
                runtime.metric(f"eval_{name}", metrics[name])
        text = _format_metrics(metrics)
        runtime.info(f"{label}: {text}")
        return {"ui": {"text": [text], "metrics": [ui_metrics(metrics)]}, "result": (metrics,)}
