"""The training engine behind the TrainingLoop node (docs/nodes.md).

Design for speed: the per-batch path does only what a hand-written PyTorch loop does (move, forward,
loss, backward, step) plus a stop check and a clock read. Losses are summed without a device sync on
every batch (a Python float on the CPU where ``.item()`` costs nothing, a list of device scalars folded
at each report elsewhere); progress, ``train_loss_batch`` and TensorBoard points go out at most every
``NODE_PROGRESS_INTERVAL_S``.

Everything ddp changes goes through the loop's strategy object (nodes/strategy.py): the device, the
model wrapper, the DataLoaders, sums over ranks, the agreement on stop and report every few batches, and
rank 0 alone writing checkpoints, TensorBoard files and events (nodes/ddp.py). Precision lives in
nodes/precision.py, evaluation and prediction in nodes/evaluation.py (re-exported here).
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

from ..common import atomic
from ..constants import (
    CHECKPOINTS_DIRNAME,
    MEMORY_METER_FULL_STEPS,
    NODE_PROGRESS_INTERVAL_S,
    TENSORBOARD_DIRNAME,
)
from . import paths, runtime
from .evaluation import accuracy_counts, batch_xy, evaluate, iter_inputs, predict_outputs
from .hostmode import autograd, trainable
from .lib.modelfile import CHECKPOINT_FORMAT, checkpoint_state
from .lib.optim import optimizer_step, optimizer_steps
from .models import spec_of
from .precision import Precision, autocast, resolve_precision
from .specs import LossSpec, OptimizerSpec, SchedulerSpec
from .strategy import DDP_NEEDS, SingleProcess, ddp_unavailable_reason, resolve_strategy

__all__ = [
    "CHECKPOINT_FORMAT", "DDP_NEEDS", "History", "Precision", "SingleProcess", "TrainConfig", "Trainer",
    "accuracy_counts", "autocast", "batch_xy", "ddp_unavailable_reason", "evaluate", "iter_inputs",
    "load_checkpoint", "predict_outputs", "resolve_precision", "resolve_strategy", "save_checkpoint",
    "stop_checker", "train",
]



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
    epoch_s: list[float] = field(default_factory=list)  # each epoch's training wall seconds (no validation)
    epoch_cpu_s: list[float] = field(default_factory=list)  # and this process's CPU seconds (gloo threads too)
    checkpoints: list[str] = field(default_factory=list)


# --- helpers ------------------------------------------------------------------------------------------


def _loader_len(loader: Any, what: str) -> int:
    try:
        return len(loader)
    except TypeError:
        raise ValueError(f"{what} has no length: the TrainingLoop needs a DataLoader over a map-style dataset "
                         f"(one you can index), not an iterable dataset") from None


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

    return atomic.write_atomic(path, lambda tmp: torch.save(state, tmp))


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors and plain data only)."""
    import torch

    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"checkpoint not found: {p}")
    try:
        state = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as exc:  # an unpickling error quotes the file's bytes: name the kind of failure only
        raise ValueError(f"{p} is not an XPU Fleet checkpoint ({type(exc).__name__})") from None
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
        self.strategy = resolve_strategy(cfg.strategy, cfg.node_label, (loader, val_loader))
        self.device = self.strategy.device(cfg.device, cfg.node_label)
        self.precision = resolve_precision(cfg.precision, self.device, cfg.node_label)
        # Train a copy: the input model stays as built (ComfyUI caches node outputs between runs).
        self.model = copy.deepcopy(model).to(self.device)
        self.spec = spec_of(model)
        self.loader = self.strategy.prepare_loader(loader, train=True, seed=cfg.seed)
        self.val_loader = (self.strategy.prepare_loader(val_loader, train=False, seed=cfg.seed)
                           if val_loader is not None else None)
        self.n_batches = _loader_len(self.loader, "the dataloader")
        if self.n_batches == 0:
            raise ValueError(f"{cfg.node_label}: the dataloader yields no batches (empty dataset, or drop_last with "
                             f"fewer samples than batch_size)")
        self.n_val_batches = _loader_len(self.val_loader, "the val_dataloader") if self.val_loader is not None else 0
        self.loss_fn = loss.build()
        self.loss_spec = loss
        self.train_model = self.strategy.wrap_model(self.model)
        self.optimizer = optimizer.build(self.model.parameters())
        self.steps_per_epoch = optimizer_steps(self.n_batches, cfg.accumulate_steps, 1)
        self.total_steps = optimizer_steps(self.n_batches, cfg.accumulate_steps, cfg.epochs, cfg.max_steps)
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
        h = self.history
        return checkpoint_state(self.strategy.unwrap_model(self.model), self.optimizer, self.scheduler,
                                self.precision.scaler, self.spec, self.epoch, self.step, reason, epoch_complete,
                                {"train_loss": h.train_loss, "val_loss": h.val_loss, "val_accuracy": h.val_accuracy})

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
            state = load_checkpoint(paths.readable_file(path, "the checkpoint"))  # where graphs may read
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
        # The bare module: its weights are the same on every rank, and no DDP hook runs in validation.
        res = evaluate(self.model, self.val_loader, self.loss_fn, self.device, self.precision, self.strategy)
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
                # strict, as options.deterministic documents: an op without a deterministic
                # implementation fails the node by name instead of warning and running anyway
                torch.use_deterministic_algorithms(True)
                stack.callback(torch.use_deterministic_algorithms, prev)
            self.board = _Board(cfg.tensorboard, self.strategy.is_main)
            stack.callback(self.board.close)
            if cfg.resume_from:
                self.resume(cfg.resume_from)
            start = time.perf_counter()
            try:
                samples = self._epochs()
            except Exception as exc:
                lost = self.strategy.lost_peer(exc)
                if lost is not None and lost is not exc:
                    raise lost from exc
                raise
            finally:
                runtime.resume_memory_meter(self._kept_tensors)
            duration = time.perf_counter() - start
            self.strategy.finish()
        model = self.strategy.unwrap_model(self.model)
        model.eval()
        if ctx is not None and self.strategy.is_main:  # per-epoch timing (bench/bench_ddp.py compares it)
            ctx.execution_facts["epoch_s"] = [round(s, 6) for s in self.history.epoch_s]
            ctx.execution_facts["epoch_cpu_s"] = [round(s, 6) for s in self.history.epoch_cpu_s]
        metrics = self._metrics(duration, samples)
        if metrics["samples_per_s"] is not None:  # the run's throughput (every rank's samples), once
            self._metric("samples_per_s", metrics["samples_per_s"], self.step)
        return model, metrics

    _meter_saw_validation = False

    def _metered_validate(self, shown_epoch: int, kept: Callable[[], Iterator[Any]], steps: int) -> Any:
        """A validation. On simulated cards the meter counts the loop's first MEMORY_METER_FULL_STEPS
        optimizer steps and its first validation in full, paused over the rest, which repeat them."""
        first = not self._meter_saw_validation
        if first:
            runtime.resume_memory_meter(kept)
        try:
            return self._validate(shown_epoch)
        finally:
            if first:
                self._meter_saw_validation = True
                if steps >= MEMORY_METER_FULL_STEPS:
                    runtime.pause_memory_meter()

    def _kept_tensors(self) -> Iterator[Any]:
        """What outlives a training step: parameters, their gradients, buffers, the optimizer's state."""
        for p in self.model.parameters():
            yield p
            if p.grad is not None:
                yield p.grad
        yield from self.model.buffers()
        for state in self.optimizer.state.values():
            yield from state.values()

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
        agree = self.strategy.agree
        # ddp: the gradient all-reduce runs on the last micro-batch of each accumulation group only.
        no_sync = self.strategy.no_sync(model) if accum > 1 else None
        params = [p for p in self.model.parameters() if p.requires_grad]
        samples = 0
        perf = time.perf_counter
        next_report = perf() + interval
        epochs = int(cfg.epochs)
        first_batch = True
        first_step = self.step  # simulated cards: the meter counts this loop's first steps (see below)
        opt.zero_grad(set_to_none=True)
        done = max_steps and self.step >= max_steps

        def forward_backward(x: Any, y: Any, i: int) -> Any:
            if amp_dtype is not None:
                with torch.autocast(dev_type, dtype=amp_dtype):
                    loss = loss_fn(model(x), y)
            else:
                loss = loss_fn(model(x), y)
            back = loss if accum == 1 else loss / (last_group if i >= last_group_start else accum)
            if scaler is not None:
                scaler.scale(back).backward()
            else:
                back.backward()
            return loss

        while self.epoch < epochs and not done:
            epoch = self.epoch
            epoch_start, cpu_start = perf(), time.process_time()
            self.strategy.set_epoch(self.loader, epoch)
            model.train()
            loss_sum = 0.0  # CPU: Python float; accelerator: folded from `pending` at each report
            pending: list[Any] = []
            loss_dev = None
            batches = 0
            last_loss = x = y = None

            def kept() -> Iterator[Any]:  # what the meter recounts on resuming: the state and this batch
                yield from self._kept_tensors()
                yield from (x, y, last_loss)  # noqa: B023 - late binding: the batch alive at resume
            for i, batch in enumerate(self.loader):
                x, y = batch[0], batch[1]
                if move:
                    x = x.to(device, non_blocking=True)
                    y = y.to(device, non_blocking=True)
                if x.is_inference() or y.is_inference():  # a dataset made under ComfyUI's inference mode
                    x, y = trainable(x), trainable(y)
                is_step = accum == 1 or (i + 1) % accum == 0 or i + 1 == n_batches
                if no_sync is not None and not is_step:
                    with no_sync():
                        loss = forward_backward(x, y, i)
                else:
                    loss = forward_backward(x, y, i)
                if on_cpu:
                    loss_sum += loss.item()
                else:
                    pending.append(loss.detach())
                last_loss = loss
                batches += 1
                samples += int(y.shape[0])
                if is_step:
                    optimizer_step(opt, scaler, params, clip)
                    self.step += 1
                    if sched_per_step:
                        sched.step()
                    step = self.step
                    if self.step - first_step == MEMORY_METER_FULL_STEPS:
                        runtime.pause_memory_meter()
                    if ckpt_steps and step % ckpt_steps == 0:
                        self.checkpoint(f"step_{step:08d}.pt", "step", epoch_complete=False)
                    if val_steps and step % val_steps == 0:
                        self._metered_validate(epoch + 1, kept, self.step - first_step)
                    if max_steps and step >= max_steps:
                        done = True
                if first_batch:
                    first_batch = False
                    self.strategy.first_batch()
                now = perf()
                due_here = now >= next_report
                if due_here:
                    next_report = now + interval
                # One answer on every rank (ddp: agreed every K batches, no collective per batch).
                stop, due = agree(stop_check(), due_here, loss, self.step)
                if stop:
                    self.stopped = True
                    break
                if done:
                    break
                if due:
                    if check_at_reports and runtime.should_stop():
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
            # Every rank is at the same batch here: one synchronous agreement, which also sums the epoch's
            # train loss over ranks (train_loss is the mean over every rank's batches).
            stop_now, loss_sum = self.strategy.settle(self.stopped or stop_check(), last_loss, self.step, loss_sum)
            self.stopped, loss_sum = self.stopped or stop_now, loss_sum / self.strategy.world_size
            self.history.epoch_s.append(perf() - epoch_start)
            self.history.epoch_cpu_s.append(time.process_time() - cpu_start)
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
            val = (self._metered_validate(shown_epoch, kept, self.step - first_step)
                   if self._last_val_step != self.step else self._last_val)
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
        # ddp: the mean over ranks of the loss at the last agreement point (no collective here)
        point = self.strategy.batch_loss(last_loss, self.step) if last_loss is not None else None
        value = point[1] if point is not None else None
        lr = float(self.optimizer.param_groups[0]["lr"])
        # The text changes once per epoch only: hosted in ComfyUI, each distinct text gets its own ProgressBar.
        text = f"epoch {epoch + 1}/{self.cfg.epochs}"
        runtime.progress(self.step, self.total_steps, text, epoch=epoch + 1, batch=batch, batches=self.n_batches,
                         loss=value, lr=lr)
        batches = self.history.train_loss_batch
        if point is not None and (not batches or batches[-1][0] != point[0]):  # each step's point once
            batches.append([point[0], value])
            self._metric("train_loss_batch", value, point[0], epoch=epoch + 1)
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
            # every rank's samples (ddp ranks each read an equal share): the throughput of the whole run
            "samples_per_s": samples * self.strategy.world_size / duration if duration > 0 else None,
        }


def train(model: Any, loader: Any, optimizer: OptimizerSpec, loss: LossSpec, cfg: TrainConfig,
          val_loader: Any = None, scheduler: SchedulerSpec | None = None) -> tuple[Any, dict[str, Any]]:
    """Run the TrainingLoop engine once (see :class:`Trainer`), outside any inference mode the host
    runs nodes under (ComfyUI's executor does; the model copy and the optimizer are made out of it)."""
    with autograd():
        return Trainer(model, loader, optimizer, loss, cfg, val_loader, scheduler).run()
