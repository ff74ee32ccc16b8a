"""What the Optimizer, LR scheduler and Loss nodes output: small, picklable specs.

An optimizer or scheduler cannot exist before the model's parameters (and, for one-cycle, the number
of steps) are known, and under ddp each rank builds its own; so those nodes output a spec and the
TrainingLoop builds the torch object. The specs are frozen dataclasses, hashable and JSON-friendly
(``asdict``), which also lets the memory estimator read the optimizer kind without torch. Each field is the
node's widget (nodes/contract.py's ``option``), so the nodes' inputs and their defaults are read from here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from . import types as T
from .contract import float_widget, int_widget, option, widget
from .lib.losses import LossFn
from .lib.optim import make_optimizer, make_scheduler, steps_per_interval

__all__ = ["LossFn", "LossSpec", "OptimizerSpec", "SchedulerSpec"]


@dataclass(frozen=True)
class OptimizerSpec:
    """An optimizer to build against a model's parameters."""

    name: str = option(widget(T.OPTIMIZER_CHOICES, "adam", "sgd_momentum = SGD with momentum"))
    lr: float = option(float_widget(1e-3, 1e-8, 10.0, 1e-4, "learning rate", round=False))
    weight_decay: float = option(float_widget(0.0, 0.0, 1.0, 1e-4, "L2 penalty (decoupled for adamw)", round=False))
    momentum: float = option(float_widget(0.9, 0.0, 0.999, 0.01, "sgd_momentum and rmsprop"))
    nesterov: bool = option(widget("BOOLEAN", False, "sgd_momentum only"))
    beta1: float = option(float_widget(0.9, 0.0, 0.9999, 0.01, "adam / adamw", advanced=True))
    beta2: float = option(float_widget(0.999, 0.0, 0.99999, 0.001, "adam / adamw", advanced=True))
    eps: float = option(float_widget(1e-8, 1e-12, 1.0, 1e-9, "adam / adamw / rmsprop numerical stability term",
                                     round=False, advanced=True))

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
        return make_optimizer(params, **asdict(self))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class SchedulerSpec:
    """A learning-rate schedule; ``interval`` says whether it steps per epoch or per optimizer step."""

    name: str = option(widget(T.SCHEDULER_CHOICES, "cosine", "the schedule (none = constant lr)"))
    interval: str = option(widget(T.SCHEDULER_INTERVALS, "epoch",
                                  "step the schedule per epoch or per optimizer step"))
    step_size: int = option(int_widget(10, 1, 1 << 30, "step: decay every step_size intervals"))
    gamma: float = option(float_widget(0.1, 1e-6, 1.0, 0.01, "step / exponential: decay factor"))
    t_max: int = option(int_widget(0, 0, 1 << 30, "cosine: period in intervals (0 = the whole run)"))
    eta_min: float = option(float_widget(0.0, 0.0, 10.0, 1e-5, "cosine: lowest lr", round=False))
    max_lr: float = option(float_widget(0.0, 0.0, 10.0, 1e-4, "onecycle: peak lr (0 = 10 x the optimizer's lr)",
                                        round=False))
    pct_start: float = option(float_widget(0.3, 0.01, 0.99, 0.01, "onecycle: fraction of the run spent warming up"))

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
        return steps_per_interval(self.name, self.interval)

    def build(self, optimizer: Any, epochs: int, total_steps: int) -> Any | None:
        """The torch scheduler (None for ``none``); ``total_steps`` = optimizer steps in the whole run."""
        return make_scheduler(optimizer, epochs, total_steps, **asdict(self))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LossSpec:
    """A loss function; targets are adapted to the model's output shape (see ``LossFn``)."""

    name: str = option(widget(T.LOSS_CHOICES, "cross_entropy", "cross_entropy / bce_with_logits for classes; "
                                                               "mse / l1 / smooth_l1 for regression"))
    label_smoothing: float = option(float_widget(0.0, 0.0, 0.99, 0.01, "cross_entropy only"))

    def __post_init__(self) -> None:
        if self.name not in T.LOSS_CHOICES:
            raise ValueError(f"unknown loss {self.name!r}; choose one of: {', '.join(T.LOSS_CHOICES)}")
        if not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")

    @property
    def classification(self) -> bool:
        return self.name in T.CLASSIFICATION_LOSSES

    def build(self) -> LossFn:
        return LossFn(self.name, self.label_smoothing)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
