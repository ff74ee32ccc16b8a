"""Training nodes (docs/nodes.md): Optimizer, LR scheduler, Loss, TrainingLoop and Evaluate."""

from __future__ import annotations

import math
from typing import Any

from ..constants import CANVAS_CURVE_POINTS
from . import device as devmod
from . import hostmode, paths, runtime
from . import types as T
from .models import resolve_seed, spec_of
from .specs import LossSpec, OptimizerSpec, SchedulerSpec

_DEVICE_INPUT = (devmod.DEVICE_CHOICES, {"default": "auto", "tooltip": "auto follows the run's first device"})
_PRECISION_INPUT = (T.PRECISION_CHOICES, {"default": "fp32", "tooltip": "autocast precision (fp16 on a CPU runs bf16)"})


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


class XPUOptimizer:
    """Optimizer node: which optimizer and its hyper-parameters (built by the TrainingLoop)."""

    DESCRIPTION = ("Chooses the optimizer: SGD (plain or with momentum), Adam, AdamW or RMSprop. The TrainingLoop "
                   "builds it over the model's parameters.")
    CATEGORY = T.CATEGORY_TRAINING
    FUNCTION = "make"
    RETURN_TYPES = (T.OPTIMIZER,)
    RETURN_NAMES = ("optimizer",)
    OUTPUT_NODE = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "name": (T.OPTIMIZER_CHOICES, {"default": "adam", "tooltip": "sgd_momentum = SGD with momentum"}),
                "lr": ("FLOAT", {"default": 1e-3, "min": 1e-8, "max": 10.0, "step": 1e-4, "round": False,
                                 "tooltip": "learning rate"}),
                "weight_decay": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1.0, "step": 1e-4, "round": False,
                                           "tooltip": "L2 penalty (decoupled for adamw)"}),
                "momentum": ("FLOAT", {"default": 0.9, "min": 0.0, "max": 0.999, "step": 0.01,
                                       "tooltip": "sgd_momentum and rmsprop"}),
            },
            "optional": {
                "nesterov": ("BOOLEAN", {"default": False, "tooltip": "sgd_momentum only"}),
                "beta1": ("FLOAT", {"default": 0.9, "min": 0.0, "max": 0.9999, "step": 0.01, "advanced": True,
                                    "tooltip": "adam / adamw"}),
                "beta2": ("FLOAT", {"default": 0.999, "min": 0.0, "max": 0.99999, "step": 0.001,
                                    "advanced": True, "tooltip": "adam / adamw"}),
                "eps": ("FLOAT", {"default": 1e-8, "min": 1e-12, "max": 1.0, "step": 1e-9, "round": False,
                                  "advanced": True, "tooltip": "adam / adamw / rmsprop numerical stability term"}),
            },
        }

    def make(self, name: str = "adam", lr: float = 1e-3, weight_decay: float = 0.0, momentum: float = 0.9,
             nesterov: bool = False, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8) -> tuple[Any]:
        return (OptimizerSpec(name=name, lr=float(lr), weight_decay=float(weight_decay), momentum=float(momentum),
                              nesterov=bool(nesterov), beta1=float(beta1), beta2=float(beta2), eps=float(eps)),)


class XPULRScheduler:
    """LR scheduler node: step, cosine, exponential, one-cycle, or none."""

    DESCRIPTION = ("A learning-rate schedule for the TrainingLoop. interval: step the schedule once per epoch or "
                   "once per optimizer step (one-cycle is always per step). cosine t_max 0 = the whole run; "
                   "onecycle max_lr 0 = 10 x the optimizer's lr.")
    CATEGORY = T.CATEGORY_TRAINING
    FUNCTION = "make"
    RETURN_TYPES = (T.LR_SCHEDULER,)
    RETURN_NAMES = ("lr_scheduler",)
    OUTPUT_NODE = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "name": (T.SCHEDULER_CHOICES, {"default": "cosine", "tooltip": "the schedule (none = constant lr)"}),
                "interval": (T.SCHEDULER_INTERVALS, {"default": "epoch",
                                                     "tooltip": "step the schedule per epoch or per optimizer step"}),
            },
            "optional": {
                "step_size": ("INT", {"default": 10, "min": 1, "max": 1 << 30,
                                      "tooltip": "step: decay every step_size intervals"}),
                "gamma": ("FLOAT", {"default": 0.1, "min": 1e-6, "max": 1.0, "step": 0.01,
                                    "tooltip": "step / exponential: decay factor"}),
                "t_max": ("INT", {"default": 0, "min": 0, "max": 1 << 30,
                                  "tooltip": "cosine: period in intervals (0 = the whole run)"}),
                "eta_min": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 10.0, "step": 1e-5, "round": False,
                                      "tooltip": "cosine: lowest lr"}),
                "max_lr": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 10.0, "step": 1e-4, "round": False,
                                     "tooltip": "onecycle: peak lr (0 = 10 x the optimizer's lr)"}),
                "pct_start": ("FLOAT", {"default": 0.3, "min": 0.01, "max": 0.99, "step": 0.01,
                                        "tooltip": "onecycle: fraction of the run spent warming up"}),
            },
        }

    def make(self, name: str = "cosine", interval: str = "epoch", step_size: int = 10, gamma: float = 0.1,
             t_max: int = 0, eta_min: float = 0.0, max_lr: float = 0.0, pct_start: float = 0.3) -> tuple[Any]:
        return (SchedulerSpec(name=name, interval=interval, step_size=int(step_size), gamma=float(gamma),
                              t_max=int(t_max), eta_min=float(eta_min), max_lr=float(max_lr),
                              pct_start=float(pct_start)),)


class XPULoss:
    """Loss node."""

    DESCRIPTION = ("The loss: cross_entropy (class labels), bce_with_logits (binary / multi-label), mse, l1, "
                   "smooth_l1 (regression; integer labels are one-hot encoded against multi-column outputs).")
    CATEGORY = T.CATEGORY_TRAINING
    FUNCTION = "make"
    RETURN_TYPES = (T.LOSS,)
    RETURN_NAMES = ("loss",)
    OUTPUT_NODE = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {"name": (T.LOSS_CHOICES, {"default": "cross_entropy",
                                                   "tooltip": "cross_entropy / bce_with_logits for classes; "
                                                              "mse / l1 / smooth_l1 for regression"})},
            "optional": {"label_smoothing": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 0.99, "step": 0.01,
                                                       "tooltip": "cross_entropy only"})},
        }

    def make(self, name: str = "cross_entropy", label_smoothing: float = 0.0) -> tuple[Any]:
        return (LossSpec(name=name, label_smoothing=float(label_smoothing)),)


class XPUTrainingLoop:
    """TrainingLoop node: trains a copy of the model and outputs it with its metrics."""

    DESCRIPTION = (
        "Trains the model: epochs (or max_steps optimizer steps), gradient accumulation and clipping, fp32/bf16/"
        "fp16 autocast, an LR schedule, checkpoints every N epochs / steps and on stop, TensorBoard event files, "
        "and metrics train_loss, train_loss_batch, val_loss, val_accuracy, val_loss_step. strategy ddp (Advanced) "
        "trains one model on several cards of a worker run; elsewhere it falls back to single."
    )
    CATEGORY = T.CATEGORY_TRAINING
    FUNCTION = "train"
    RETURN_TYPES = (T.MODEL, T.METRICS)
    RETURN_NAMES = ("model", "metrics")
    # An output node: training is the job (checkpoints, TensorBoard, metrics), so a graph that ends at
    # the TrainingLoop runs, in ComfyUI's executor as in ours.
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": (T.MODEL, {"tooltip": "the model to train (a copy is trained; the input stays as built)"}),
                "dataloader": (T.DATALOADER, {"tooltip": "training batches"}),
                "optimizer": (T.OPTIMIZER, {"tooltip": "an Optimizer node"}),
                "loss": (T.LOSS, {"tooltip": "a Loss node"}),
                "epochs": ("INT", {"default": 10, "min": 1, "max": 1_000_000, "tooltip": "passes over the dataloader"}),
                "max_steps": ("INT", {"default": 0, "min": 0, "max": 1 << 40,
                                      "tooltip": "stop after this many optimizer steps (0 = no limit)"}),
                "device": _DEVICE_INPUT,
                "precision": _PRECISION_INPUT,
            },
            "optional": {
                "val_dataloader": (T.DATALOADER, {"tooltip": "validated after every epoch: val_loss, val_accuracy"}),
                "lr_scheduler": (T.LR_SCHEDULER, {"tooltip": "an LR Scheduler node"}),
                "accumulate_steps": ("INT", {"default": 1, "min": 1, "max": 4096,
                                             "tooltip": "batches whose gradients make one optimizer step"}),
                "grad_clip_norm": ("FLOAT", {"default": 0.0, "min": 0.0, "max": 1e6, "step": 0.1,
                                             "tooltip": "clip the gradient norm (0 = off)"}),
                "checkpoint_every": ("INT", {"default": 0, "min": 0, "max": 1_000_000,
                                             "tooltip": "write a checkpoint every N epochs (0 = off)"}),
                "checkpoint_every_steps": ("INT", {"default": 0, "min": 0, "max": 1 << 40,
                                                   "tooltip": "write a checkpoint every N optimizer steps (0 = off)"}),
                "val_every_steps": ("INT", {"default": 0, "min": 0, "max": 1 << 40,
                                            "tooltip": "also validate every N optimizer steps (val_loss_step)"}),
                "seed": ("INT", {"default": 0, "min": -1, "max": 2**31 - 1,
                                 "tooltip": "seed of shuffling and dropout (-1 = unseeded); a run's seed overrides it"}),
                "tensorboard": ("BOOLEAN", {"default": True, "tooltip": "write TensorBoard event files"}),
                "strategy": (T.STRATEGY_CHOICES, {"default": "single", "advanced": True,
                                                  "tooltip": "ddp: one model on every card of a worker run"}),
                "resume_from": ("STRING", {"default": "", "advanced": True,
                                           "tooltip": "checkpoint to continue from (an interrupted epoch restarts)"}),
                "checkpoint_dir": ("STRING", {"default": "", "advanced": True,
                                              "tooltip": "'' = the run directory's checkpoints folder; else a "
                                                         "folder inside the run directory (outside a run: "
                                                         "inside the outputs folder); no '..', not absolute"}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, seed: int = 0, resume_from: str = "", **_: Any) -> Any:
        """The caching rule (see nodes/hostmode.py): seeded and unchanged = ComfyUI may reuse the
        trained model; seed -1, or a resume_from checkpoint that changed on disk, trains again."""
        return hostmode.combine(hostmode.seed_rerun_key(seed), hostmode.file_key(resume_from))

    @classmethod
    def VALIDATE_INPUTS(cls, checkpoint_dir: Any = None) -> bool | str:
        """A checkpoint_dir that cannot stay inside the run directory is refused before anything runs."""
        if checkpoint_dir is None or checkpoint_dir == "":
            return True
        if not isinstance(checkpoint_dir, str):
            return "checkpoint_dir must be a string"
        problem = paths.relative_path_problem(checkpoint_dir)
        return True if problem is None else (f"checkpoint_dir {problem}; checkpoints go inside the run directory "
                                             f"(outside a run: the outputs folder): give a relative folder name")

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


class XPUEvaluate:
    """Evaluate node: loss and accuracy of a model on a dataloader (an output node)."""

    DESCRIPTION = "Loss and accuracy of a model on a dataloader (e.g. the validation split)."
    CATEGORY = T.CATEGORY_TRAINING
    FUNCTION = "evaluate"
    RETURN_TYPES = (T.METRICS,)
    RETURN_NAMES = ("metrics",)
    OUTPUT_NODE = True

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "model": (T.MODEL, {"tooltip": "the model to evaluate"}),
                "dataloader": (T.DATALOADER, {"tooltip": "the data to evaluate on (e.g. the val split)"}),
                "device": _DEVICE_INPUT,
                "precision": _PRECISION_INPUT,
            },
            "optional": {"loss": (T.LOSS, {"tooltip": "default: cross_entropy for classifiers, else mse"})},
        }

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


NODE_CLASS_MAPPINGS: dict[str, type] = {
    T.OPTIMIZER_NODE: XPUOptimizer,
    T.LR_SCHEDULER_NODE: XPULRScheduler,
    T.LOSS_NODE: XPULoss,
    T.TRAINING_LOOP_NODE: XPUTrainingLoop,
    T.EVALUATE_NODE: XPUEvaluate,
}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {
    T.OPTIMIZER_NODE: "Optimizer",
    T.LR_SCHEDULER_NODE: "LR Scheduler",
    T.LOSS_NODE: "Loss",
    T.TRAINING_LOOP_NODE: "Training Loop",
    T.EVALUATE_NODE: "Evaluate",
}
