"""Autocast precision of the TrainingLoop, Evaluate and Predict nodes (docs/nodes.md: fp32/bf16/fp16)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import runtime
from . import types as T
from .lib.precision import autocast as lib_autocast
from .lib.precision import autocast_dtype, choose_precision


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
    name, why = choose_precision(requested, device)
    if why is not None:
        runtime.warn("precision_fallback", f"{who}{why}", requested=requested, precision=name)
    if name != "fp16":
        return Precision(name, autocast_dtype(name), None)
    scaler = None
    try:
        scaler = torch.amp.GradScaler(kind)
    except Exception as exc:  # a backend without a scaler still runs fp16 autocast
        runtime.warn("precision_fallback", f"{who}no gradient scaler for {kind} ({exc}); fp16 without loss scaling.",
                     requested="fp16", precision="fp16")
    return Precision("fp16", autocast_dtype(name), scaler)


def autocast(device: Any, precision: Precision) -> Any:
    """An autocast context for ``precision`` (a no-op context for fp32)."""
    return lib_autocast(device, precision.dtype)
