"""What the Optimizer, LR scheduler and Loss nodes output: small, picklable specs.

An optimizer or scheduler cannot exist before the model's parameters (and, for one-cycle, the number
of steps) are known, and under ddp each rank builds its own; so those nodes output a spec and the
TrainingLoop builds the torch object. The specs are frozen dataclasses, hashable and JSON-friendly
(``asdict``), which also lets the memory estimator read the optimizer kind without torch.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from . import types as T


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer to build against a model's parameters."""

    name: str = "adam"
    lr: float = 1e-3
    weight_decay: float = 0.0
    momentum: float = 0.9  # SGD with momentum, RMSprop
    nesterov: bool = False
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.name not in T.OPTIMIZER_CHOICES:
            raise ValueError(f"unknown optimizer {self.name!r}; choose one of: {', '.join(T.OPTIMIZER_CHOICES)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"optimizer lr must be a positive number, got {self.lr}")
        if self.weight_decay < 0:
            raise ValueError(f"optimizer weight_decay must be >= 0, got {self.weight_decay}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"optimizer momentum must be in [0, 1), got {self.momentum}")
        if self.name == "sgd_momentum" and self.nesterov and self.momentum == 0:
            # torch refuses Nesterov without momentum; say so before a run starts
            raise ValueError("optimizer nesterov needs a momentum above 0 (got 0.0): raise momentum or turn nesterov off")

    def build(self, params: Any) -> Any:
        """The torch optimizer over ``params``."""
        import torch

        if self.name == "adam":
            return torch.optim.Adam(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps,
                                    weight_decay=self.weight_decay)
        if self.name == "adamw":
            return torch.optim.AdamW(params, lr=self.lr, betas=(self.beta1, self.beta2), eps=self.eps,
                                     weight_decay=self.weight_decay)
        if self.name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, weight_decay=self.weight_decay)
        if self.name == "sgd_momentum":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum, nesterov=self.nesterov,
                                   weight_decay=self.weight_decay)
        return torch.optim.RMSprop(params, lr=self.lr, momentum=self.momentum, eps=self.eps,
                                   weight_decay=self.weight_decay)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SchedulerSpec:
    """A learning-rate schedule; ``interval`` says whether it steps per epoch or per optimizer step."""

    name: str = "none"
    interval: str = "epoch"
    step_size: int = 10  # step: decay every step_size intervals
    gamma: float = 0.1  # step / exponential decay factor
    t_max: int = 0  # cosine period in intervals; 0 = the whole run
    eta_min: float = 0.0  # cosine floor
    max_lr: float = 0.0  # onecycle peak; 0 = 10 x the optimizer's lr
    pct_start: float = 0.3  # onecycle warm-up fraction

    def __post_init__(self) -> None:
        if self.name not in T.SCHEDULER_CHOICES:
            raise ValueError(f"unknown LR scheduler {self.name!r}; choose one of: {', '.join(T.SCHEDULER_CHOICES)}")
        if self.interval not in T.SCHEDULER_INTERVALS:
            raise ValueError(f"LR scheduler interval must be 'epoch' or 'step', got {self.interval!r}")
        if self.step_size < 1:
            raise ValueError(f"LR scheduler step_size must be >= 1, got {self.step_size}")
        if not 0 < self.gamma <= 1.0 + 1e-12 and self.name in ("step", "exponential"):
            raise ValueError(f"LR scheduler gamma must be in (0, 1], got {self.gamma}")
        if not 0 < self.pct_start < 1:
            raise ValueError(f"LR scheduler pct_start must be in (0, 1), got {self.pct_start}")

    @property
    def per_step(self) -> bool:
        """One-cycle is defined per optimizer step whatever ``interval`` says."""
        return self.name == "onecycle" or self.interval == "step"

    def build(self, optimizer: Any, epochs: int, total_steps: int) -> Any | None:
        """The torch scheduler (None for ``none``); ``total_steps`` = optimizer steps in the whole run."""
        import torch

        sched = torch.optim.lr_scheduler
        if self.name == "none":
            return None
        if self.name == "step":
            return sched.StepLR(optimizer, step_size=self.step_size, gamma=self.gamma)
        if self.name == "exponential":
            return sched.ExponentialLR(optimizer, gamma=self.gamma)
        span = max(1, total_steps if self.per_step else epochs)
        if self.name == "cosine":
            return sched.CosineAnnealingLR(optimizer, T_max=self.t_max or span, eta_min=self.eta_min)
        base = optimizer.param_groups[0]["lr"]
        return sched.OneCycleLR(optimizer, max_lr=self.max_lr or base * 10, total_steps=max(1, total_steps),
                                pct_start=self.pct_start)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LossSpec:
    """A loss function; targets are adapted to the model's output shape (see ``LossFn``)."""

    name: str = "cross_entropy"
    label_smoothing: float = 0.0

    def __post_init__(self) -> None:
        if self.name not in T.LOSS_CHOICES:
            raise ValueError(f"unknown loss {self.name!r}; choose one of: {', '.join(T.LOSS_CHOICES)}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")

    @property
    def classification(self) -> bool:
        return self.name in T.CLASSIFICATION_LOSSES

    def build(self) -> LossFn:
        return LossFn(self)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class LossFn:
    """Callable ``loss(outputs, targets)`` (mean over the batch) with the target adapted to the outputs.

    A plain object rather than an ``nn.Module``: no hooks to run on every batch. Adaptations: integer
    class labels become one-hot floats for bce/mse/l1 against multi-column outputs, and a 1-D target
    gains a column against (N, 1) outputs. A mismatch torch rejects is re-raised naming both shapes.
    """

    def __init__(self, spec: LossSpec) -> None:
        import torch.nn.functional as F

        self.spec = spec
        self.name = spec.name
        self._F = F
        fn = {"cross_entropy": None, "mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss,
              "bce_with_logits": F.binary_cross_entropy_with_logits}[spec.name]
        self._fn = fn

    def target_for(self, out: Any, y: Any) -> Any:
        """The target tensor the loss compares ``out`` against."""
        if self.name == "cross_entropy":
            return y
        if not y.is_floating_point():
            if out.dim() == 2 and out.shape[1] > 1 and y.dim() == 1:
                return self._F.one_hot(y, out.shape[1]).to(out.dtype)
            y = y.to(out.dtype)
        if y.dim() == 1 and out.dim() == 2 and out.shape[1] == 1:
            y = y.unsqueeze(1)
        return y

    def __call__(self, out: Any, y: Any) -> Any:
        try:
            if self._fn is None:
                return self._F.cross_entropy(out, y, label_smoothing=self.spec.label_smoothing)
            t = self.target_for(out, y)
            if t.dtype != out.dtype:
                t = t.to(out.dtype)
            return self._fn(out, t)
        except (RuntimeError, ValueError, IndexError) as exc:
            first = str(exc).splitlines()[0]
            hint = ""
            if self.name == "cross_entropy" and y.is_floating_point() and y.shape != out.shape:
                hint = " (cross_entropy needs class labels; for a regression target use mse or l1)"
            elif self.name == "cross_entropy" and out.dim() == 2 and not y.is_floating_point() and y.numel() and \
                    int(y.max()) >= out.shape[1]:
                hint = f" (labels go up to {int(y.max())} but the model has {out.shape[1]} outputs)"
            raise ValueError(f"loss {self.name}: model outputs {list(out.shape)} vs targets {list(y.shape)} "
                             f"({str(y.dtype).removeprefix('torch.')}): {first}{hint}") from None
