"""Resolving a node's ``device`` parameter (docs/nodes.md, docs/sidecar.md).

Accepted values: ``auto``, ``cpu``, ``cuda``, ``cuda:N``, ``xpu``, ``xpu:N``, ``mps``. Inside a queued
run, names are the run's in-run names (renumbered from 0); ``auto`` follows the run's first device,
and a device the run lacks falls back with a ``device_fallback`` warning worded as docs/workers.md words it.
"""

from __future__ import annotations

import re
from typing import Any

from . import runtime

# A combo (the canvas shows a list): the indices an 8-card machine needs.
DEVICE_CHOICES = (["auto", "cpu", "cuda", *(f"cuda:{i}" for i in range(8)), "xpu", *(f"xpu:{i}" for i in range(8))]
                  + ["mps"])
_DEVICE_RE = re.compile(r"^(auto|cpu|mps|cuda|xpu)(?::(\d+))?$")


def parse_device(name: str) -> tuple[str, int | None]:
    """Split ``cuda:1`` into ``("cuda", 1)``; raise ValueError with what is accepted."""
    m = _DEVICE_RE.match(str(name).strip().lower())
    if not m or (m.group(1) in ("auto", "cpu", "mps") and m.group(2) is not None and m.group(1) != "mps"):
        raise ValueError(f"invalid device {name!r}: use auto, cpu, cuda, cuda:N, xpu, xpu:N or mps")
    return m.group(1), (int(m.group(2)) if m.group(2) is not None else None)


def available_devices() -> list[str]:
    """Devices this process can use, by torch's names (lazy torch import)."""
    import torch

    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        out += [f"xpu:{i}" for i in range(xpu.device_count())]
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        out.append("mps")
    return out


def _match(requested: str, offered: list[str]) -> str | None:
    kind, index = parse_device(requested)
    if kind == "mps":
        return next((d for d in offered if d.startswith("mps")), None)
    if index is None:
        return next((d for d in offered if d.split(":")[0] == kind), None)
    return requested if requested in offered else None


def _describe_run_devices(ctx: runtime.RunContext) -> str:
    n = len(ctx.devices)
    parts = []
    for d in ctx.devices:
        alias = ctx.device_aliases.get(d)
        parts.append(f"{d} = the worker's {alias}" if alias and ctx.placement == "worker" else d)
    noun = "card" if n == 1 else "cards"
    return f"{n} {noun} ({', '.join(parts)})"


def choose_device(requested: str, node_label: str = "") -> str:
    """The in-run device name a node set to ``requested`` runs on, warning on fallback."""
    requested = (requested or "auto").strip().lower()
    parse_device(requested)
    ctx = runtime.current()
    if requested == "cpu":
        return "cpu"  # every run and every machine has the CPU
    offered = list(ctx.devices) if ctx is not None else available_devices()
    if requested == "auto":
        if ctx is not None:
            return offered[0]
        accel = [d for d in offered if d != "cpu"]
        return accel[0] if accel else "cpu"
    got = _match(requested, offered)
    if got is not None:
        return got
    fallback = offered[0] if ctx is not None else "cpu"
    label = node_label or (f"{ctx.node_id} ({ctx.class_type})" if ctx and ctx.node_id else "this node")
    if ctx is not None:
        what = f"this run has {_describe_run_devices(ctx)}"
    else:
        what = f"this machine offers {', '.join(offered)}"
    runtime.warn(
        "device_fallback",
        f"Node {label} is set to device {requested}; {what}, so when it executes, it runs on {fallback}.",
        requested=requested,
        device=fallback,
    )
    return fallback


def torch_device(requested: str, node_label: str = "") -> Any:
    """``torch.device`` for a node's ``device`` parameter.

    Simulated cards (docs/architecture.md) are scheduled as CUDA cards but the work runs on the CPU.
    """
    import torch

    name = choose_device(requested, node_label)
    ctx = runtime.current()
    if ctx is not None and ctx.execution_facts.get("simulated_devices"):
        if name != "cpu" and name.split(":")[0] == "cuda":
            return torch.device("cpu")
    return torch.device(name)
