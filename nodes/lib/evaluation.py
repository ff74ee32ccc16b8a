"""Evaluation (the TrainingLoop's validation, the Evaluate node) and the Predict node's figures
(docs/nodes.md); inlined into exported scripts (nodes/lib/__init__.py).
"""

from __future__ import annotations

from .losses import accuracy_counts
from .precision import autocast

__all__ = ["accuracy_counts", "autocast", "batch_xy", "evaluate", "summarise_predictions"]

# --- inlined by xpufleet export from here


def batch_xy(batch):
    """(inputs, targets) of one DataLoader batch."""
    if isinstance(batch, (list, tuple)) and len(batch) >= 2:
        return batch[0], batch[1]
    if isinstance(batch, dict) and "x" in batch and "y" in batch:
        return batch["x"], batch["y"]
    raise ValueError(f"a batch must be (inputs, targets); the DataLoader gave {type(batch).__name__}")


def evaluate(model, loader, loss_fn, device, amp_dtype=None, limit=None, all_sum=None):
    """Mean loss (per sample) and accuracy of ``model`` on ``loader``; one device sync at the end.

    ``limit`` counts only the first samples (a ddp shard's real ones: DistributedSampler pads the last
    shard with repeats) and ``all_sum`` adds the sums over every rank, so the figures equal a
    single-process validation of the whole set.
    """
    import torch

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
                with autocast(device, amp_dtype):
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
    if all_sum is not None:
        totals = all_sum(totals)
    loss_total, correct_total, n_total, pred_total = (float(v) for v in totals.tolist())
    return {
        "loss": loss_total / n_total if n_total else float("nan"),
        "accuracy": (correct_total / pred_total) if has_acc and pred_total else None,
        "n_samples": int(n_total),
    }


def summarise_predictions(raw, targets, output, spec, show):
    """(predictions, mode, accuracy or None, summary lines) of raw outputs; ``output`` auto = class
    indices for a classifier, raw outputs otherwise; ``targets`` may be None."""
    import torch

    spec = spec or {}
    classifier = spec.get("task") == "classification" or (
        spec.get("task") is None and targets is not None and not targets.is_floating_point())
    mode = output if output != "auto" else ("classes" if classifier else "raw")
    if mode == "classes":
        preds = (raw > 0).long().squeeze(1) if raw.dim() == 2 and raw.shape[1] == 1 else raw.argmax(dim=1)
    elif mode == "probabilities":
        preds = torch.sigmoid(raw) if raw.dim() == 2 and raw.shape[1] == 1 else torch.softmax(raw, dim=1)
    else:
        preds = raw
    lines = [f"{preds.shape[0]} predictions ({mode}), shape {list(preds.shape)}"]
    accuracy = None
    if mode == "classes" and targets is not None and not targets.is_floating_point():
        accuracy = (preds == targets.view(-1)).double().mean().item()
        lines.append(f"accuracy vs labels {accuracy:.4f}")
    classes = spec.get("classes")
    head = preds[: int(show)].tolist()
    if mode == "classes" and classes:
        head = [classes[i] if 0 <= i < len(classes) else i for i in head]
    if show:
        lines.append(f"first {len(head)}: {head}")
    return preds, mode, accuracy, lines
