"""The Loss node's function and the accuracy its classification losses count (docs/nodes.md); inlined
into exported scripts (nodes/lib/__init__.py).
"""

from __future__ import annotations

# --- inlined by xpufleet export from here


class LossFn:
    """Callable ``loss(outputs, targets)`` (mean over the batch) with the target adapted to the outputs.

    A plain object rather than an ``nn.Module``: no hooks to run on every batch. Adaptations: integer
    class labels become one-hot floats for bce/mse/l1 against multi-column outputs, and a 1-D target
    gains a column against (N, 1) outputs. A mismatch torch rejects is re-raised naming both shapes.
    """

    def __init__(self, name, label_smoothing=0.0):
        import torch.nn.functional as F

        self.name = name
        self.label_smoothing = float(label_smoothing)
        self._F = F
        self._fn = {"cross_entropy": None, "mse": F.mse_loss, "l1": F.l1_loss, "smooth_l1": F.smooth_l1_loss,
                    "bce_with_logits": F.binary_cross_entropy_with_logits}[name]

    def target_for(self, out, y):
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

    def __call__(self, out, y):
        try:
            if self._fn is None:
                return self._F.cross_entropy(out, y, label_smoothing=self.label_smoothing)
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


def accuracy_counts(out, target, loss_name):
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
