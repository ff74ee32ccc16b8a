"""How the TrainingLoop spreads its work (docs/nodes.md ``strategy``, §4): the seam between the loop and ddp.

Everything a multi-process strategy changes goes through a strategy object: the device the loop trains
on, wrapping the model (DistributedDataParallel), re-making each DataLoader with a DistributedSampler
and ``set_epoch``, summing losses and validation counts over ranks, agreeing every few batches on a
stop and on a report, and letting only rank 0 write checkpoints, TensorBoard files and events.
:class:`SingleProcess` is the identity of all of that; :class:`~.ddp.DistributedStrategy` is ddp.
:func:`resolve_strategy` picks one and, where ddp cannot apply, falls back to single-process training
with a ``ddp_not_available`` warning that says why (docs/workers.md's cases).
"""

from __future__ import annotations

import sys
from typing import Any

from . import device as devmod
from . import runtime
from . import types as T

DDP_NEEDS = "ddp needs a queued run on a worker with two or more cards"
# What an exported script says about a ddp loop (nodes/export.py): it always trains in one process.
EXPORT_REASON = f"an exported script trains in one process; {DDP_NEEDS}"


class SingleProcess:
    """Training in this process on one device: every hook is the identity."""

    name = "single"
    world_size = 1
    rank = 0
    is_main = True
    backend: str | None = None

    def device(self, requested: str, node_label: str) -> Any:
        """The torch device the loop trains on: the node's ``device`` parameter."""
        return devmod.torch_device(requested, node_label)

    def wrap_model(self, model: Any) -> Any:
        return model

    def unwrap_model(self, model: Any) -> Any:
        return model

    def prepare_loader(self, loader: Any, train: bool, seed: int | None = None) -> Any:
        """The DataLoader this rank reads (ddp: its DistributedSampler shard, shuffled with ``seed``)."""
        return loader

    def set_epoch(self, loader: Any, epoch: int) -> None:
        sampler = getattr(loader, "sampler", None)
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)

    def real_samples(self, loader: Any) -> int | None:
        """How many samples of ``loader`` are real (not sampler padding); None = all of them."""
        return None

    def all_sum(self, values: Any) -> Any:
        """Sum a tensor over ranks (validation loss/correct/count, train loss)."""
        return values

    def agree(self, stop: bool, due: bool, loss: Any = None, step: int = 0) -> tuple[bool, bool]:
        """After a batch (``loss``: its loss, ``step``: optimizer steps so far): (stop now, report now),
        the same answer on every rank (ddp: agreed every K batches, see nodes/ddp.py)."""
        return stop, due

    def settle(self, stop: bool, loss: Any = None, step: int = 0, total: float = 0.0) -> tuple[bool, float]:
        """The end of an epoch's batches (or of the loop), called on every rank: (stop now, ``total``
        summed over ranks), the same answer on every rank (ddp: one collective for both)."""
        return stop, total

    def batch_loss(self, loss: Any, step: int) -> tuple[int, float] | None:
        """The ``train_loss_batch`` point to report now: (step, value); ddp: the mean over ranks at the
        last agreement point."""
        return (step, float(loss.item())) if loss is not None else None

    def no_sync(self, model: Any) -> Any:
        """A context that skips the gradient all-reduce (accumulation micro-batches); None = not needed."""
        return None

    def first_batch(self) -> None:
        """Called once, after this rank's first training batch."""

    def finish(self) -> None:
        """Called on every rank when the loop ended normally (records per-rank facts on rank 0)."""

    def lost_peer(self, exc: BaseException) -> Exception | None:
        """``exc`` as a "another rank went away" error when it is one (ddp), else None."""
        return None

    def facts(self) -> dict[str, Any]:
        return {"strategy": self.name, "world_size": self.world_size, "backend": self.backend}


def _hosted() -> bool:
    # ComfyUI imports comfy.model_management at start-up, long before any node runs.
    return "comfy.model_management" in sys.modules


def _accelerators(devices: list[str]) -> list[str]:
    return [d for d in devices if d.split(":")[0] in ("cuda", "xpu")]


def ddp_unavailable_reason(ctx: runtime.RunContext | None, node_id: str | None = None) -> str | None:
    """Why this loop cannot train with ddp (docs/workers.md's fallback cases), or None when it can."""
    if ctx is None or ctx.placement == "canvas":
        if ctx is None and not _hosted():
            return f"this loop runs outside a queued run (plain Python), in one process; {DDP_NEEDS}"
        return (f"the canvas Run executes in the ComfyUI process; {DDP_NEEDS} (Queue on... -> a worker, two or "
                f"more of its cards)")
    accel = _accelerators(ctx.devices)
    if ctx.placement != "worker":
        return f"runs on this server (target {ctx.placement}) train in one process, even with a device set; {DDP_NEEDS}"
    spread = ctx.ddp is not None and ctx.ddp.store_host is not None  # ddp across workers: ranks elsewhere too
    if len(accel) < 2 and not spread:
        what = ", ".join(ctx.devices) or "cpu"
        return f"this run on a worker has {len(accel)} card{'s' if len(accel) != 1 else ''} ({what}); {DDP_NEEDS}"
    kinds = sorted({d.split(":")[0] for d in accel})
    if len(kinds) > 1:
        return f"this run's cards are of different kinds ({', '.join(accel)}); ddp trains on cards of one kind"
    role = ctx.ddp
    if role is None:
        return f"this run was not started for ddp; {DDP_NEEDS}"
    if node_id is not None and node_id not in role.loops:
        return ("its strategy input comes from a link, so the run could not plan the ranks before it started; "
                "set strategy to ddp on the node itself")
    from .ddp import backend_for

    if backend_for(kinds[0], role.simulated) is None:
        return f"this PyTorch has no collective backend for {kinds[0]} cards (xccl)"
    return None


def resolve_strategy(requested: str, node_label: str = "TrainingLoop", loaders: tuple[Any, ...] = ()) -> Any:
    """The strategy object for ``requested`` (``single`` | ``ddp``), warning when ddp falls back.

    ``loaders`` (the loop's DataLoaders) are checked before any rank starts, so a loop ddp cannot
    shard (an iterable dataset, a custom sampler) fails at once with what to change.
    """
    if requested not in T.STRATEGY_CHOICES:
        raise ValueError(f"strategy must be one of {', '.join(T.STRATEGY_CHOICES)}, got {requested!r}")
    if requested != "ddp":
        return SingleProcess()
    ctx = runtime.current()
    reason = ddp_unavailable_reason(ctx, ctx.node_id if ctx is not None else None)
    if reason is None:
        from .ddp import DistributedStrategy, check_loader

        for loader in loaders:
            if loader is not None:
                check_loader(loader, node_label)
        return DistributedStrategy(ctx, node_label)
    runtime.warn("ddp_not_available", f"Node {node_label}: strategy ddp falls back to single-process training: "
                 f"{reason}.", requested="ddp", strategy="single")
    return SingleProcess()
