"""Evaluation and prediction helpers of the TrainingLoop, Evaluate and Predict nodes.

``evaluate`` is the validation of the TrainingLoop (every rank evaluates its own shard under ddp; the
strategy sums the figures over ranks, and padded samples are left out so each sample counts once) and
the body of the Evaluate node. ``predict_outputs`` is the Predict node's forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from . import runtime
from .lib.evaluation import accuracy_counts, batch_xy
from .lib.evaluation import evaluate as lib_evaluate
from .precision import Precision, autocast

__all__ = ["accuracy_counts", "batch_xy", "evaluate", "iter_inputs", "predict_outputs"]


def evaluate(model: Any, loader: Any, loss_fn: Any, device: Any, precision: Precision,
             strategy: Any = None) -> dict[str, Any]:
    """Mean loss (per sample) and accuracy of ``model`` on ``loader`` (nodes/lib/evaluation.py).

    With a ddp ``strategy`` the loader is this rank's shard: only its first ``real_samples`` samples
    are counted and the sums are added over every rank.
    """
    if strategy is None:
        return lib_evaluate(model, loader, loss_fn, device, precision.dtype)
    return lib_evaluate(model, loader, loss_fn, device, precision.dtype, strategy.real_samples(loader),
                        strategy.all_sum)


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
                yield batch_xy(batch)
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
