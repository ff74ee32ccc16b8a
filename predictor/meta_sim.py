"""A training step and an evaluation simulated on PyTorch's meta device, counting the bytes alive (docs/memory.md).

Meta tensors have shapes and dtypes but no memory, so a model of any size is built and stepped in
milliseconds. :class:`LiveBytes` is a ``TorchDispatchMode`` that counts every storage an op creates from
that op until its last tensor is gone (a weak reference on the storage, whose Python object PyTorch keeps
as long as the storage lives), so its peak is the most tensor memory the step holds at once: the batch,
the activations saved for backward, gradients, optimizer state, and the temporaries of backward and of
the optimizer step (foreach, as PyTorch uses on CUDA).

``torch.autocast`` leaves meta tensors alone, so :class:`AutocastSim` does for them what CUDA autocast
does: the inputs of matrix products and convolutions are cast to the half type (the casts of parameters
cached for the region, as autocast caches them), losses, softmax and layer norm run in float32, and the
master weights, gradients and optimizer state stay float32.

This module imports torch: import it lazily.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map


class LiveBytes(TorchDispatchMode):
    """Bytes of tensor storage alive, and the peak since :meth:`reset_peak` (see the module docstring)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: dict[int, int] = {}

    def _gone(self, key: int) -> None:
        self.live -= self._seen.pop(key, 0)

    def track(self, tensor: Any) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self._seen:
            return
        size = storage.nbytes()
        self._seen[key] = size
        self.live += size
        if self.live > self.peak:
            self.peak = self.live
        weakref.finalize(storage, self._gone, key)

    def track_all(self, tensors: Iterable[Any]) -> None:
        for t in tensors:
            self.track(t)

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)
        return out


HALF = {"bf16": torch.bfloat16, "fp16": torch.float16}
# What CUDA autocast runs in the half type, and in float32 (the parts of its lists these models reach).
LOWER_PRECISION = frozenset({F.linear, torch.conv1d, torch.conv2d, torch.conv3d, torch.conv_transpose1d,
                             torch.conv_transpose2d, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__,
                             torch.mm, torch.bmm, torch.addmm, torch.baddbmm, torch.addbmm,
                             F.scaled_dot_product_attention})
FLOAT32 = frozenset({F.layer_norm, torch.layer_norm, F.group_norm, F.softmax, F.log_softmax, torch.softmax,
                     torch.log_softmax, torch.Tensor.softmax, torch.Tensor.log_softmax, F.cross_entropy, F.nll_loss,
                     F.mse_loss, F.l1_loss, F.smooth_l1_loss, F.binary_cross_entropy_with_logits, torch.exp,
                     torch.log, torch.pow, torch.Tensor.pow, torch.sum, torch.Tensor.sum, torch.norm,
                     torch.cumsum})


class AutocastSim(TorchFunctionMode):
    """CUDA autocast's casts, for meta tensors (see the module docstring)."""

    def __init__(self, dtype: Any) -> None:
        super().__init__()
        self.dtype = dtype
        self.cache: dict[int, tuple[Any, Any]] = {}  # id(parameter) -> (parameter, its half copy)

    def _half(self, t: Any) -> Any:
        if not isinstance(t, torch.Tensor) or t.dtype != torch.float32:
            return t
        if t.is_leaf and t.requires_grad:
            hit = self.cache.get(id(t))
            if hit is None or hit[0] is not t:
                hit = self.cache[id(t)] = (t, t.to(self.dtype))
            return hit[1]
        return t.to(self.dtype)

    @staticmethod
    def _float(t: Any) -> Any:
        return t.float() if isinstance(t, torch.Tensor) and t.dtype in (torch.bfloat16, torch.float16) else t

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if func in LOWER_PRECISION:
            args, kwargs = tree_map(self._half, args), tree_map(self._half, kwargs)
        elif func in FLOAT32:
            args, kwargs = tree_map(self._float, args), tree_map(self._float, kwargs)
        return func(*args, **kwargs)

    def __exit__(self, *exc: Any) -> Any:
        self.cache.clear()  # as autocast drops its cast cache when the region ends
        return super().__exit__(*exc)


def autocast(precision: str) -> Any:
    """The autocast region of a precision (a no-op context for fp32)."""
    import contextlib

    return AutocastSim(HALF[precision]) if precision in HALF else contextlib.nullcontext()


@dataclass(frozen=True)
class StepMemory:
    """What a simulated step held at its peak, in all, and the model's weights and buffers among it."""

    peak: int
    weights: int

    @property
    def beyond_weights(self) -> int:
        return max(0, self.peak - self.weights)


def _nbytes(tensors: Iterable[Any]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        seen[st._cdata] = st.nbytes()
    return sum(seen.values())


def sample_output_shape(model: Any, input_shape: list[int], precision: str = "fp32") -> list[int]:
    """The per-sample output shape of a meta ``model`` (one forward pass of 2 samples, as batch norm
    needs more than one; nothing tracked)."""
    with torch.no_grad(), autocast(precision):
        return [int(d) for d in model(torch.empty((2, *input_shape), device="meta")).shape[1:]]


def _target(batch: int, out_shape: list[int], loss: Mapping[str, Any], task: str | None) -> Any:
    """A meta target for a batch, shaped as the loss compares it with the output: class labels for
    cross_entropy on a classifier, else the output's own shape in float32, as the dataset gives it."""
    name = loss.get("name") or ("cross_entropy" if task == "classification" else "mse")
    if name == "cross_entropy" and out_shape:
        return torch.empty((batch, *out_shape[1:]), dtype=torch.long, device="meta")
    return torch.empty((batch, *out_shape), device="meta")


def _loss_fn(loss: Mapping[str, Any], task: str | None) -> Any:
    from ..nodes.specs import LossSpec

    name = loss.get("name") or ("cross_entropy" if task == "classification" else "mse")
    if name == "none":
        return None
    return LossSpec(name, float(loss.get("label_smoothing", 0.0))).build()


def _start(model: Any, input_shape: list[int], out_shape: list[int] | None, loss: Mapping[str, Any],
           task: str | None, precision: str) -> tuple[list[int], Any, int, LiveBytes]:
    """What a simulated step starts from: the per-sample output shape, the loss, the bytes of the weights
    (parameters and buffers) and a ``LiveBytes`` that already counts them."""
    if out_shape is None:
        out_shape = sample_output_shape(model, input_shape, precision)
    resident = [*model.parameters(), *model.buffers()]
    mode = LiveBytes()
    mode.track_all(resident)
    return out_shape, _loss_fn(loss, task), _nbytes(resident), mode


def simulate_train(model: Any, input_shape: list[int], batch: int, *, optimizer: Mapping[str, Any],
                   loss: Mapping[str, Any], task: str | None, precision: str = "fp32",
                   grad_clip_norm: float = 0.0, out_shape: list[int] | None = None) -> StepMemory:
    """One training step of a meta ``model`` as the TrainingLoop runs it once the optimizer has state (the
    largest step: every later one is the same, the first lacks the state during backward): the batch
    arrives, forward and loss under autocast, backward, optional clipping, the optimizer step (foreach,
    PyTorch's default on CUDA), then ``zero_grad(set_to_none=True)``. ``out_shape``: the per-sample output
    shape when known (:func:`sample_output_shape`)."""
    from ..nodes.specs import OptimizerSpec

    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = None
    if params:
        opt = OptimizerSpec(name=str(optimizer.get("name", "adam")), momentum=float(optimizer.get("momentum", 0.9)),
                            weight_decay=float(optimizer.get("weight_decay", 0.0))).build(params)
        for group in opt.param_groups:
            if "foreach" in group:
                group["foreach"] = True
        for p in params:  # the state the first step leaves (its own peak is never the larger)
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
    out_shape, loss_fn, weights, mode = _start(model, input_shape, out_shape, loss, task, precision)
    if opt is not None:
        mode.track_all(t for st in opt.state.values() for t in st.values()
                       if isinstance(t, torch.Tensor) and t.device.type == "meta")
    with mode:
        x = torch.empty((batch, *input_shape), device="meta")  # the batch and its targets
        y = _target(batch, out_shape, loss, task)
        with autocast(precision):
            out = model(x)
            value = loss_fn(out, y) if loss_fn is not None else out.float().mean()
        if value.requires_grad:
            value.backward()
        del x, y, out, value
        if opt is not None:
            if grad_clip_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, grad_clip_norm)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return StepMemory(mode.peak, weights)


def simulate_eval(model: Any, input_shape: list[int], batch: int, *, loss: Mapping[str, Any],
                  task: str | None, precision: str = "fp32", out_shape: list[int] | None = None) -> StepMemory:
    """One evaluation batch of a meta ``model`` under ``torch.no_grad()`` and autocast, with its loss."""
    model.eval()
    out_shape, loss_fn, weights, mode = _start(model, input_shape, out_shape, loss, task, precision)
    with mode, torch.no_grad():
        x = torch.empty((batch, *input_shape), device="meta")
        y = _target(batch, out_shape, loss, task)
        with autocast(precision):
            out = model(x)
            if loss_fn is not None:
                loss_fn(out, y)
        del x, y, out
    return StepMemory(mode.peak, weights)
