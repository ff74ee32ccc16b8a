"""Autocast precision (docs/nodes.md: fp32/bf16/fp16): what runs on a device and its autocast context;
inlined into exported scripts (nodes/lib/__init__.py).
"""

from __future__ import annotations

# --- inlined by xpufleet export from here
import contextlib


def choose_precision(requested, device):
    """(the precision that runs on ``device``, why it differs from ``requested``, or None)."""
    import torch

    if requested == "fp16" and device.type == "cpu":
        return "bf16", "fp16 autocast is not supported on the CPU; training in bf16 instead."
    if requested == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        return "fp16", "this card does not support bf16; training in fp16 with loss scaling instead."
    return requested, None


def autocast_dtype(name):
    """The autocast dtype of precision ``name`` (None for fp32)."""
    import torch

    return {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}[name]


def autocast(device, dtype):
    """An autocast context for ``dtype`` on ``device`` (a no-op context for None: fp32)."""
    import torch

    return torch.autocast(device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
