"""Evaluation and prediction helpers of the TrainingLoop, Evaluate and Predict nodes.

``evaluate`` is the validation of the TrainingLoop (every rank evaluates its own shard under ddp; the
strategy sums the figures over ranks, and padded samples are left out so each sample counts once) and
the body of the Evaluate node. ``predict_outputs`` is the Predict node's forward pass.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from . import runtime
from .precision import Precision, autocast


def batch_xy(batch: Any) -> tuple[Any, Any]:
    """(inputs, targets) of one DataLoader batch."""
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
             strategy: Any = None) -> dict[str, Any]:
    """Mean loss (per sample) and accuracy of ``model`` on ``loader``; one device sync at the end.

    With a ddp ``strategy`` the loader is this rank's shard: only its first ``real_samples`` samples
    are counted (DistributedSampler pads the last shard with repeats), and the sums are added over
    every rank, so the figures equal a single-process validation of the whole set.
    """
    import torch

    was_training = model.training
    model.eval()
    move = device.type != "cpu"
    limit = strategy.real_samples(loader) if strategy is not None else None
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    n = 0
    n_pred = 0
    has_acc = True
    try:
        with torch.no_grad():
            for batch in loader:
                x, y = batch_xy(batch)
                if limit is not None:
                    room = limit - n
                    if room <= 0:
                        break  # only padding is left in this shard
                    if int(y.shape[0]) > room:
                        x, y = x[:room], y[:room]
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
    totals = torch.stack([loss_sum, correct, torch.tensor(float(n), dtype=torch.float64, device=device),
                          torch.tensor(float(n_pred), dtype=torch.float64, device=device)])
    if strategy is not None:
        totals = strategy.all_sum(totals)
    loss_total, correct_total, n_total, pred_total = (float(v) for v in totals.tolist())
    return {
        "loss": loss_total / n_total if n_total else float("nan"),
        "accuracy": (correct_total / pred_total) if has_acc and pred_total else None,
        "n_samples": int(n_total),
    }


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
