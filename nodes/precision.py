"""Autocast precision of the TrainingLoop, Evaluate and Predict nodes (docs/nodes.md: fp32/bf16/fp16)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from . import runtime
from . import types as T


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
