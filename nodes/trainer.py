"""The training engine behind the TrainingLoop node (SPEC N4), and the evaluation/prediction helpers.

Design for speed: the per-batch path does only what a hand-written PyTorch loop does (move, forward,
loss, backward, step) plus a stop check and a clock read. Losses are summed without a device sync on
every batch (a Python float on the CPU where ``.item()`` costs nothing, a list of device scalars folded
at each report elsewhere); progress, ``train_loss_batch`` and TensorBoard points go out at most every
``NODE_PROGRESS_INTERVAL_S``.

Design for ddp (a later issue): everything a multi-process strategy changes goes through a
``Strategy`` object: wrapping the model (DistributedDataParallel), re-making each DataLoader with a
DistributedSampler and ``set_epoch``, all-reducing loss sums and validation counts, agreeing on a stop
per batch, and letting only rank 0 write checkpoints, TensorBoard files and events. ``SingleProcess``
is the identity of all of that; ``resolve_strategy`` falls back to it with ``ddp_not_available``.
"""

from __future__ import annotations

import contextlib
import copy
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..constants import CHECKPOINTS_DIRNAME, NODE_PROGRESS_INTERVAL_S, TENSORBOARD_DIRNAME
from . import device as devmod
from . import paths, runtime
from . import types as T
from .hostmode import autograd, trainable
from .models import spec_of
from .specs import LossSpec, OptimizerSpec, SchedulerSpec

CHECKPOINT_FORMAT = "xpufleet-checkpoint"
CHECKPOINT_VERSION = 1
DDP_NEEDS = "ddp needs a queued run on a worker with two or more cards"


# --- strategy -----------------------------------------------------------------------------------------


class SingleProcess:
    """Training in this process on one device: every hook is the identity."""

    name = "single"
    world_size = 1
    rank = 0
    is_main = True
    backend: str | None = None

    def wrap_model(self, model: Any) -> Any:
        return model

    def unwrap_model(self, model: Any) -> Any:
        return model

    def prepare_loader(self, loader: Any, train: bool) -> Any:
        return loader

    def set_epoch(self, loader: Any, epoch: int) -> None:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def all_sum(self, values: Any) -> Any:
        """Sum a tensor over ranks (validation loss/correct/count, train loss)."""
        return values

    def any_stop(self, local: bool) -> bool:
        """A stop on any rank stops every rank at the same batch."""
        return local

    def facts(self) -> dict[str, Any]:
        return {"strategy": self.name, "world_size": self.world_size}


def ddp_unavailable_reason(ctx: runtime.RunContext | None) -> str:
    """Why this run cannot train with ddp (seed 000's fallback cases); every case falls back for now."""
    if ctx is None or ctx.placement == "canvas":
        return f"the canvas Run executes in the ComfyUI process; {DDP_NEEDS}"
    accel = [d for d in ctx.devices if d.split(":")[0] in ("cuda", "xpu")]
    if ctx.placement != "worker":
        return f"runs on this server (target {ctx.placement}) train in one process, even with a device set; {DDP_NEEDS}"
    if len(accel) < 2:
        what = ", ".join(ctx.devices) or "cpu"
        return f"this run on a worker has {len(accel)} card{'s' if len(accel) != 1 else ''} ({what}); {DDP_NEEDS}"
    if not ctx.ddp_allowed:
        return f"this run was not started for ddp; {DDP_NEEDS}"
    return "ddp training is not available in this version; the loop trains in a single process"


def resolve_strategy(requested: str, node_label: str = "TrainingLoop") -> SingleProcess:
    """The strategy object for ``requested`` (``single`` | ``ddp``), warning when ddp falls back."""
    if requested not in T.STRATEGY_CHOICES:
        raise ValueError(f"strategy must be one of {', '.join(T.STRATEGY_CHOICES)}, got {requested!r}")
    if requested == "ddp":
        reason = ddp_unavailable_reason(runtime.current())
        runtime.warn("ddp_not_available", f"Node {node_label}: strategy ddp falls back to single-process training: "
                     f"{reason}.", requested="ddp", strategy="single")
    return SingleProcess()


def _never() -> bool:
    return False


def stop_checker() -> Callable[[], bool]:
    """The per-batch stop check: ``runtime.should_stop`` inside a run or hosted in ComfyUI.

    With neither (plain Python), nothing can ask for a stop, so the loop checks only at each progress
    report. Hosted means ComfyUI's ``comfy.model_management`` is loaded (ComfyUI imports it at start-up,
    long before a node runs); looking for an importable ``comfy`` instead would mistake any folder of
    that name on ``sys.path`` for ComfyUI.
    """
    if runtime.current() is not None or "comfy.model_management" in sys.modules:
        return runtime.should_stop
    return _never


# --- precision ----------------------------------------------------------------------------------------


@dataclass
class Precision:
    name: str  # what actually runs: fp32 | bf16 | fp16
    dtype: Any  # autocast dtype, None for fp32
    scaler: Any  # GradScaler for fp16 on an accelerator, else None


def resolve_precision(requested: str, device: Any, node_label: str = "") -> Precision:
    """Autocast settings for ``requested`` on ``device``; unsupported combinations fall back with a warning."""
    import torch

    if requested not in T.PRECISION_CHOICES:
        raise ValueError(f"precision must be one of {', '.join(T.PRECISION_CHOICES)}, got {requested!r}")
    kind = device.type
    who = f"{node_label}: " if node_label else ""
    if requested == "fp32":
        return Precision("fp32", None, None)
    if requested == "fp16" and kind == "cpu":
        runtime.warn("precision_fallback", f"{who}fp16 autocast is not supported on the CPU; training in bf16 "
                     f"instead.", requested="fp16", precision="bf16")
        requested = "bf16"
    if requested == "bf16" and kind == "cuda" and not torch.cuda.is_bf16_supported():
        runtime.warn("precision_fallback", f"{who}this card does not support bf16; training in fp16 with loss "
                     f"scaling instead.", requested="bf16", precision="fp16")
        requested = "fp16"
    if requested == "bf16":
        return Precision("bf16", torch.bfloat16, None)
    scaler = None
    try:
        scaler = torch.amp.GradScaler(kind)
    except Exception as exc:  # a backend without a scaler still runs fp16 autocast
        runtime.warn("precision_fallback", f"{who}no gradient scaler for {kind} ({exc}); fp16 without loss scaling.",
                     requested="fp16", precision="fp16")
    return Precision("fp16", torch.float16, scaler)


def autocast(device: Any, precision: Precision) -> Any:
    """An autocast context for ``precision`` (a no-op context for fp32)."""
    import torch

    if precision.dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=precision.dtype)


# --- config -------------------------------------------------------------------------------------------


@dataclass
class TrainConfig:
    """The TrainingLoop node's settings."""

    epochs: int = 10
    max_steps: int = 0  # optimizer steps; 0 = no limit
    accumulate_steps: int = 1
    grad_clip_norm: float = 0.0
    precision: str = "fp32"
    device: str = "auto"
    checkpoint_every: int = 0  # epochs; 0 = never
    checkpoint_every_steps: int = 0  # optimizer steps; 0 = never
    val_every_steps: int = 0  # extra validations every N optimizer steps (val_loss_step); 0 = epoch ends only
    seed: int | None = None
    tensorboard: bool = True
    strategy: str = "single"
    resume_from: str = ""
    # "" = <run dir>/checkpoints (or a fresh folder under the outputs folder); else a folder inside the
    # run dir (outside a run: inside the outputs folder)
    checkpoint_dir: str = ""
    node_label: str = "TrainingLoop"
    progress_interval_s: float = NODE_PROGRESS_INTERVAL_S

    def validate(self) -> None:
        for name in ("epochs", "accumulate_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{self.node_label}: {name} must be >= 1, got {getattr(self, name)}")
        for name in ("max_steps", "checkpoint_every", "checkpoint_every_steps", "val_every_steps"):
            if int(getattr(self, name)) < 0:
                raise ValueError(f"{self.node_label}: {name} must be >= 0 (0 = off), got {getattr(self, name)}")
        if self.grad_clip_norm < 0 or not math.isfinite(self.grad_clip_norm):
            raise ValueError(f"{self.node_label}: grad_clip_norm must be >= 0 (0 = off), got {self.grad_clip_norm}")


@dataclass
class History:
    """Everything the loop measured; ``as_metrics`` is the TrainingLoop's metrics output."""

    train_loss: list[float] = field(default_factory=list)
    val_loss: list[float] = field(default_factory=list)
    val_accuracy: list[float] = field(default_factory=list)
    train_loss_batch: list[list[float]] = field(default_factory=list)  # [step, loss] at report times
    val_loss_step: list[list[float]] = field(default_factory=list)  # [step, val loss]
    lr: list[list[float]] = field(default_factory=list)  # [step, lr] at report times
    checkpoints: list[str] = field(default_factory=list)


# --- helpers ------------------------------------------------------------------------------------------


def _loader_len(loader: Any, what: str) -> int:
    try:
        return len(loader)
    except TypeError:
        raise ValueError(f"{what} has no length: the TrainingLoop needs a DataLoader over a map-style dataset "
                         f"(one you can index), not an iterable dataset") from None


def _batch_xy(batch: Any) -> tuple[Any, Any]:
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return batch[0], batch[1]
    if isinstance(batch, dict) and "x" in batch and "y" in batch:
        return batch["x"], batch["y"]
    raise ValueError(f"a batch must be (inputs, targets); the DataLoader gave {type(batch).__name__}")


def accuracy_counts(out: Any, target: Any, loss_name: str) -> tuple[Any, int] | None:
    """(correct as a device tensor, number of predictions) for classification losses, else None."""
    if loss_name == "cross_entropy":
        pred = out.argmax(dim=1)
        if target.is_floating_point() and target.shape == out.shape:  # soft / one-hot labels
            target = target.argmax(dim=1)
        return (pred == target).sum(), int(target.numel())
    if loss_name == "bce_with_logits":
        t = target
        if not t.is_floating_point() and out.dim() == 2 and out.shape[1] > 1 and t.dim() == 1:
            return (out.argmax(dim=1) == t).sum(), int(t.numel())
        if t.dim() == 1 and out.dim() == 2 and out.shape[1] == 1:
            t = t.unsqueeze(1)
        return ((out > 0) == (t > 0.5)).sum(), int(t.numel())
    return None


def evaluate(model: Any, loader: Any, loss_fn: Any, device: Any, precision: Precision,
             strategy: SingleProcess | None = None) -> dict[str, Any]:
    """Mean loss (per sample) and accuracy of ``model`` on ``loader``; one device sync at the end."""
    import torch

    strategy = strategy or SingleProcess()
    was_training = model.training
    model.eval()
    move = device.type != "cpu"
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    n = 0
    n_pred = 0
    has_acc = True
    try:
        with torch.no_grad():
            for batch in loader:
                x, y = _batch_xy(batch)
                if move:
                    x = x.to(device, non_blocking=True)
                    y = y.to(device, non_blocking=True)
                with autocast(device, precision):
                    out = model(x)
                    loss = loss_fn(out, y)
                bs = int(y.shape[0])
                loss_sum += loss.detach().double() * bs
                n += bs
                if has_acc:
                    got = accuracy_counts(out.float(), y, loss_fn.name)
                    if got is None:
                        has_acc = False
                    else:
                        correct += got[0]
                        n_pred += got[1]
    finally:
        model.train(was_training)
    totals = strategy.all_sum(torch.stack([loss_sum, correct, torch.tensor(float(n), dtype=torch.float64,
                                           device=device), torch.tensor(float(n_pred), dtype=torch.float64,
                                                                        device=device)]))
    loss_total, correct_total, n_total, pred_total = (float(v) for v in totals.tolist())
    return {
        "loss": loss_total / n_total if n_total else float("nan"),
        "accuracy": (correct_total / pred_total) if has_acc and pred_total else None,
        "n_samples": int(n_total),
    }


class _Board:
    """TensorBoard scalars when tensorboard is installed and wanted; a no-op otherwise."""

    def __init__(self, enabled: bool, is_main: bool) -> None:
        self.writer = None
        self.dir: Path | None = None
        if not (enabled and is_main):
            return
        try:
            from torch.utils.tensorboard import SummaryWriter
        except Exception as exc:  # tensorboard not installed
            runtime.info(f"TensorBoard event files off: {exc}")
            return
        self.dir = paths.work_dir(TENSORBOARD_DIRNAME)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.writer = SummaryWriter(log_dir=str(self.dir))
        runtime.artifact(self.dir, "tensorboard")

    def scalar(self, name: str, value: float, step: int) -> None:
        if self.writer is not None and value is not None and math.isfinite(value):
            self.writer.add_scalar(name, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()
            self.writer = None


def save_checkpoint(path: Path, state: dict[str, Any]) -> Path:
    """Write a checkpoint atomically (torch.save to a temp file, then rename)."""
    import torch

    return paths.write_atomic(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only)."""
    import torch

    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"checkpoint not found: {p}")
    state = torch.load(p, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or state.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{p} is not an XPU Fleet checkpoint")
    return state


# --- the loop -----------------------------------------------------------------------------------------


class Trainer:
    """One TrainingLoop execution: build, run epochs, report, checkpoint, stop."""

    def __init__(self, model: Any, loader: Any, optimizer: OptimizerSpec, loss: LossSpec, cfg: TrainConfig,
                 val_loader: Any = None, scheduler: SchedulerSpec | None = None) -> None:
        import torch

        cfg.validate()
        if not isinstance(optimizer, OptimizerSpec):
            raise ValueError(f"{cfg.node_label}: 'optimizer' must come from an Optimizer node")
        if not isinstance(loss, LossSpec):
            raise ValueError(f"{cfg.node_label}: 'loss' must come from a Loss node")
        if scheduler is not None and not isinstance(scheduler, SchedulerSpec):
            raise ValueError(f"{cfg.node_label}: 'lr_scheduler' must come from an LR Scheduler node")
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"{cfg.node_label}: 'model' must be a torch module (connect a model builder)")
        self.cfg = cfg
        self.strategy = resolve_strategy(cfg.strategy, cfg.node_label)
        self.device = devmod.torch_device(cfg.device, cfg.node_label)
        self.precision = resolve_precision(cfg.precision, self.device, cfg.node_label)
        # Train a copy: the input model stays as built (ComfyUI caches node outputs between runs).
        self.model = copy.deepcopy(model).to(self.device)
        self.spec = spec_of(model)
        self.loader = self.strategy.prepare_loader(loader, train=True)
        self.val_loader = self.strategy.prepare_loader(val_loader, train=False) if val_loader is not None else None
        self.n_batches = _loader_len(self.loader, "the dataloader")
        if self.n_batches == 0:
            raise ValueError(f"{cfg.node_label}: the dataloader yields no batches (empty dataset, or drop_last with "
                             f"fewer samples than batch_size)")
        self.n_val_batches = _loader_len(self.val_loader, "the val_dataloader") if self.val_loader is not None else 0
        self.loss_fn = loss.build()
        self.loss_spec = loss
        self.train_model = self.strategy.wrap_model(self.model)
        self.optimizer = optimizer.build(self.model.parameters())
        accum = int(cfg.accumulate_steps)
        self.steps_per_epoch = math.ceil(self.n_batches / accum)
        total = self.steps_per_epoch * int(cfg.epochs)
        self.total_steps = min(total, int(cfg.max_steps)) if cfg.max_steps else total
        self.scheduler_spec = scheduler
        self.scheduler = scheduler.build(self.optimizer, int(cfg.epochs), self.total_steps) if scheduler else None
        self.sched_per_step = bool(scheduler and scheduler.per_step and self.scheduler is not None)
        self.history = History()
        self.step = 0
        self.epoch = 0  # epochs completed
        self.batch_size = int(getattr(loader, "batch_size", 0) or 0)
        self.ckpt_dir: Path | None = (paths.work_folder(cfg.checkpoint_dir, f"{cfg.node_label}: checkpoint_dir")
                                      if cfg.checkpoint_dir else None)
        self.board: _Board | None = None
        self.stopped = False
        self._last_val_step = -1

    # -- checkpoints --

    def _checkpoint_state(self, reason: str, epoch_complete: bool) -> dict[str, Any]:
        model = self.strategy.unwrap_model(self.model)
        return {
            "format": CHECKPOINT_FORMAT,
            "version": CHECKPOINT_VERSION,
            "reason": reason,
            "epoch": self.epoch,
            "epoch_complete": epoch_complete,
            "step": self.step,
            "xpu_spec": self.spec,
            "model": {k: v.detach().cpu() for k, v in model.state_dict().items()},
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.precision.scaler.state_dict() if self.precision.scaler is not None else None,
            "train_loss": list(self.history.train_loss),
            "val_loss": list(self.history.val_loss),
            "val_accuracy": list(self.history.val_accuracy),
        }

    def checkpoint(self, name: str, reason: str, epoch_complete: bool = True) -> Path | None:
        if not self.strategy.is_main:
            return None
        if self.ckpt_dir is None:
            self.ckpt_dir = paths.work_dir(CHECKPOINTS_DIRNAME)
        path = save_checkpoint(self.ckpt_dir / name, self._checkpoint_state(reason, epoch_complete))
        self.history.checkpoints.append(str(path))
        runtime.artifact(path, "checkpoint", reason=reason, epoch=self.epoch, step=self.step)
        return path

    def resume(self, path: str) -> None:
        try:
            state = load_checkpoint(path)
        except ValueError as exc:
            raise ValueError(f"{self.cfg.node_label}: resume_from: {exc}") from None
        model = self.strategy.unwrap_model(self.model)
        try:
            model.load_state_dict(state["model"])
        except RuntimeError as exc:
            raise ValueError(f"{self.cfg.node_label}: checkpoint {path} does not fit this model: "
                             f"{str(exc).splitlines()[0]}") from None
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler"):
            self.scheduler.load_state_dict(state["scheduler"])
        if self.precision.scaler is not None and state.get("scaler"):
            self.precision.scaler.load_state_dict(state["scaler"])
        # An interrupted epoch is trained again from its start (the sampler order is per epoch).
        self.epoch = int(state["epoch"])
        self.step = int(state["step"])
        self.history.train_loss = list(state.get("train_loss", []))
        self.history.val_loss = list(state.get("val_loss", []))
        self.history.val_accuracy = list(state.get("val_accuracy", []))
        runtime.info(f"{self.cfg.node_label}: resumed from {path} at epoch {self.epoch}, step {self.step}")

    # -- reporting --

    def _metric(self, name: str, value: float | None, step: int, **extra: Any) -> None:
        if value is None or not self.strategy.is_main:
            return
        runtime.metric(name, value, step=step, **extra)
        if self.board is not None:
            self.board.scalar(name, value, step)

    def _validate(self, shown_epoch: int) -> dict[str, Any] | None:
        """Validate now; every validation is a ``val_loss_step`` point at the current optimizer step."""
        if self.val_loader is None or self.n_val_batches == 0:
            return None
        res = evaluate(self.train_model, self.val_loader, self.loss_fn, self.device, self.precision, self.strategy)
        self._last_val_step, self._last_val = self.step, res
        self.history.val_loss_step.append([self.step, res["loss"]])
        self._metric("val_loss_step", res["loss"], self.step, epoch=shown_epoch)
        return res

    # -- main --

    def run(self) -> tuple[Any, dict[str, Any]]:
        """Train; return the trained model (on its device) and the metrics dict."""
        import torch

        cfg = self.cfg
        seed = cfg.seed
        ctx = runtime.current()
        if ctx is not None and self.strategy.is_main:
            ctx.execution_facts.update(self.strategy.facts())
            ctx.execution_facts["effective_batch_size"] = self.effective_batch_size
        with contextlib.ExitStack() as stack:
            if seed is not None:
                stack.enter_context(torch.random.fork_rng(devices=[]))
                torch.manual_seed(int(seed) + self.strategy.rank)
            if ctx is not None and ctx.deterministic:
                prev = torch.are_deterministic_algorithms_enabled()
                torch.use_deterministic_algorithms(True, warn_only=True)
                stack.callback(torch.use_deterministic_algorithms, prev, warn_only=True)
            self.board = _Board(cfg.tensorboard, self.strategy.is_main)
            stack.callback(self.board.close)
            if cfg.resume_from:
                self.resume(cfg.resume_from)
            start = time.perf_counter()
            samples = self._epochs()
            duration = time.perf_counter() - start
        model = self.strategy.unwrap_model(self.model)
        model.eval()
        return model, self._metrics(duration, samples)

    @property
    def effective_batch_size(self) -> int:
        return self.batch_size * int(self.cfg.accumulate_steps) * self.strategy.world_size

    def _epochs(self) -> int:
        """The epoch loop; returns the number of training samples seen."""
        import torch

        cfg = self.cfg
        model, opt, loss_fn, device = self.train_model, self.optimizer, self.loss_fn, self.device
        amp_dtype, scaler = self.precision.dtype, self.precision.scaler
        dev_type = device.type
        move = dev_type != "cpu"
        on_cpu = not move
        accum = int(cfg.accumulate_steps)
        clip = float(cfg.grad_clip_norm)
        max_steps = int(cfg.max_steps)
        ckpt_steps = int(cfg.checkpoint_every_steps)
        val_steps = int(cfg.val_every_steps) if self.n_val_batches else 0
        sched, sched_per_step = self.scheduler, self.sched_per_step
        n_batches = self.n_batches
        last_group_start = (n_batches // accum) * accum  # batches from here form a shorter last group
        last_group = n_batches - last_group_start
        interval = float(cfg.progress_interval_s)
        stop_check = stop_checker()
        check_at_reports = stop_check is _never
        any_stop = self.strategy.any_stop
        params = [p for p in self.model.parameters() if p.requires_grad]
        samples = 0
        perf = time.perf_counter
        next_report = perf() + interval
        epochs = int(cfg.epochs)
        opt.zero_grad(set_to_none=True)
        done = max_steps and self.step >= max_steps
        while self.epoch < epochs and not done:
            epoch = self.epoch
            self.strategy.set_epoch(self.loader, epoch)
            model.train()
            loss_sum = 0.0  # CPU: Python float; accelerator: folded from `pending` at each report
            pending: list[Any] = []
            loss_dev = None
            batches = 0
            last_loss = None
            for i, batch in enumerate(self.loader):
                x, y = batch[0], batch[1]
                if move:
                    x = x.to(device, non_blocking=True)
                    y = y.to(device, non_blocking=True)
                if x.is_inference() or y.is_inference():  # a dataset made under ComfyUI's inference mode
                    x, y = trainable(x), trainable(y)
                if amp_dtype is not None:
                    with torch.autocast(dev_type, dtype=amp_dtype):
                        loss = loss_fn(model(x), y)
                else:
                    loss = loss_fn(model(x), y)
                if accum == 1:
                    back = loss
                else:
                    back = loss / (last_group if i >= last_group_start else accum)
                if scaler is not None:
                    scaler.scale(back).backward()
                else:
                    back.backward()
                if on_cpu:
                    loss_sum += loss.item()
                else:
                    pending.append(loss.detach())
                last_loss = loss
                batches += 1
                samples += int(y.shape[0])
                if accum == 1 or (i + 1) % accum == 0 or i + 1 == n_batches:
                    if scaler is not None:
                        if clip:
                            scaler.unscale_(opt)
                            torch.nn.utils.clip_grad_norm_(params, clip)
                        scaler.step(opt)
                        scaler.update()
                    else:
                        if clip:
                            torch.nn.utils.clip_grad_norm_(params, clip)
                        opt.step()
                    opt.zero_grad(set_to_none=True)
                    self.step += 1
                    if sched_per_step:
                        sched.step()
                    step = self.step
                    if ckpt_steps and step % ckpt_steps == 0:
                        self.checkpoint(f"step_{step:08d}.pt", "step", epoch_complete=False)
                    if val_steps and step % val_steps == 0:
                        self._validate(epoch + 1)
                    if max_steps and step >= max_steps:
                        done = True
                if any_stop(stop_check()):
                    self.stopped = True
                    break
                if done:
                    break
                now = perf()
                if now >= next_report:
                    next_report = now + interval
                    if check_at_reports and any_stop(runtime.should_stop()):
                        self.stopped = True
                        break
                    if pending:
                        folded = torch.stack(pending).sum()
                        loss_dev = folded if loss_dev is None else loss_dev + folded
                        pending.clear()
                    self._report(epoch, i + 1, last_loss)
            if pending:
                folded = torch.stack(pending).sum()
                loss_dev = folded if loss_dev is None else loss_dev + folded
            if loss_dev is not None:
                loss_sum = float(loss_dev.item())
            if self.strategy.world_size > 1:  # train_loss is the mean over every rank's batches
                total = self.strategy.all_sum(torch.tensor([loss_sum], dtype=torch.float64, device=device))
                loss_sum = float(total.item()) / self.strategy.world_size
            if self.stopped:
                self._stop(epoch, i + 1)
            # Only max_steps ends an epoch early (a stop raised above); anything else ran the whole loader.
            epoch_complete = batches == n_batches or not done
            if epoch_complete:
                self.epoch += 1
            shown_epoch = epoch + 1
            train_loss = loss_sum / max(1, batches)
            self.history.train_loss.append(train_loss)
            self._metric("train_loss", train_loss, self.step, epoch=shown_epoch)
            self._report(epoch, batches, last_loss)
            # A validation that val_every_steps just ran at this very step is not repeated.
            val = self._validate(shown_epoch) if self._last_val_step != self.step else self._last_val
            if val is not None:
                self.history.val_loss.append(val["loss"])
                self._metric("val_loss", val["loss"], self.step, epoch=shown_epoch)
                if val["accuracy"] is not None:
                    self.history.val_accuracy.append(val["accuracy"])
                    self._metric("val_accuracy", val["accuracy"], self.step, epoch=shown_epoch)
            if sched is not None and not sched_per_step:
                sched.step()
            if cfg.checkpoint_every and epoch_complete and self.epoch % int(cfg.checkpoint_every) == 0:
                self.checkpoint(f"epoch_{self.epoch:04d}.pt", "epoch")
        return samples

    _last_val: dict[str, Any] | None = None

    def _report(self, epoch: int, batch: int, last_loss: Any) -> None:
        if not self.strategy.is_main:
            return
        value = float(last_loss.item()) if last_loss is not None else None
        lr = float(self.optimizer.param_groups[0]["lr"])
        # The text changes once per epoch only: hosted in ComfyUI, each distinct text gets its own ProgressBar.
        text = f"epoch {epoch + 1}/{self.cfg.epochs}"
        runtime.progress(self.step, self.total_steps, text, epoch=epoch + 1, batch=batch, batches=self.n_batches,
                         loss=value, lr=lr)
        if value is not None:
            self.history.train_loss_batch.append([self.step, value])
            self._metric("train_loss_batch", value, self.step, epoch=epoch + 1)
        self.history.lr.append([self.step, lr])
        if self.board is not None:
            self.board.scalar("lr", lr, self.step)

    def _stop(self, epoch: int, batch: int) -> None:
        path = self.checkpoint("interrupt.pt", "interrupt", epoch_complete=False)
        where = f"epoch {epoch + 1}, batch {batch}, step {self.step}"
        runtime.info(f"{self.cfg.node_label}: stopped at {where}" + (f"; interrupt checkpoint {path}" if path else ""))
        if self.board is not None:
            self.board.close()
        raise runtime.stopped(f"stopped at {where}" + (f"; interrupt checkpoint written to {path}" if path else ""))

    def _metrics(self, duration: float, samples: int) -> dict[str, Any]:
        h = self.history
        return {
            "strategy": self.strategy.name,
            "world_size": self.strategy.world_size,
            "backend": self.strategy.backend,
            "device": str(self.device),
            "precision": self.precision.name,
            "epochs_completed": self.epoch,
            "steps": self.step,
            "effective_batch_size": self.effective_batch_size,
            "train_loss": h.train_loss,
            "val_loss": h.val_loss,
            "val_accuracy": h.val_accuracy,
            "train_loss_batch": h.train_loss_batch,
            "val_loss_step": h.val_loss_step,
            "lr": h.lr,
            "final_train_loss": h.train_loss[-1] if h.train_loss else None,
            "final_val_loss": h.val_loss[-1] if h.val_loss else None,
            "final_val_accuracy": h.val_accuracy[-1] if h.val_accuracy else None,
            "checkpoints": h.checkpoints,
            "tensorboard_dir": str(self.board.dir) if self.board is not None and self.board.dir else None,
            "duration_s": duration,
            "samples_per_s": samples / duration if duration > 0 else None,
        }


def train(model: Any, loader: Any, optimizer: OptimizerSpec, loss: LossSpec, cfg: TrainConfig,
          val_loader: Any = None, scheduler: SchedulerSpec | None = None) -> tuple[Any, dict[str, Any]]:
    """Run the TrainingLoop engine once (see :class:`Trainer`), outside any inference mode the host
    runs nodes under (ComfyUI's executor does; the model copy and the optimizer are made out of it)."""
    with autograd():
        return Trainer(model, loader, optimizer, loss, cfg, val_loader, scheduler).run()


# --- prediction ---------------------------------------------------------------------------------------


def iter_inputs(source: Any, batch_size: int) -> Iterator[tuple[Any, Any]]:
    """(x, y-or-None) batches from a DataLoader, a dataset, or a tensor of inputs."""
    import torch

    if isinstance(source, torch.Tensor):
        for start in range(0, source.shape[0], batch_size):
            yield source[start:start + batch_size], None
        return
    if isinstance(source, torch.utils.data.DataLoader):
        for batch in source:
            if isinstance(batch, torch.Tensor):
                yield batch, None
            else:
                yield _batch_xy(batch)
        return
    if hasattr(source, "x") and isinstance(source.x, torch.Tensor):
        y = getattr(source, "y", None)
        for start in range(0, source.x.shape[0], batch_size):
            yield source.x[start:start + batch_size], (y[start:start + batch_size] if y is not None else None)
        return
    if hasattr(source, "__getitem__") and hasattr(source, "__len__"):
        from .tensordata import collate

        loader = torch.utils.data.DataLoader(source, batch_size=batch_size, shuffle=False, collate_fn=collate)
        yield from iter_inputs(loader, batch_size)
        return
    raise ValueError(f"cannot predict on {type(source).__name__}: connect a dataset or a dataloader")


def predict_outputs(model: Any, source: Any, device: Any, precision: Precision, batch_size: int = 256,
                    stop: Callable[[], bool] | None = None) -> tuple[Any, Any]:
    """Raw model outputs (float32, CPU) for every input, and the targets when the source has them."""
    import torch

    was_training = model.training
    model.eval()
    outs, ys = [], []
    try:
        with torch.no_grad():
            for x, y in iter_inputs(source, batch_size):
                if stop is not None and stop():
                    raise runtime.stopped("stopped during prediction")
                with autocast(device, precision):
                    out = model(x.to(device, non_blocking=True))
                outs.append(out.float().cpu())
                if y is not None:
                    ys.append(y)
    finally:
        model.train(was_training)
    if not outs:
        raise ValueError("nothing to predict: the dataset or dataloader is empty")
    targets = torch.cat(ys) if ys and len(ys) == len(outs) else None
    return torch.cat(outs), targets
