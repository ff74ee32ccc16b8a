"""How nodes live with the executor that calls them (docs/nodes.md): autograd mode and ComfyUI's cache rule.

ComfyUI runs every node inside ``torch.inference_mode()``. A node that trains must leave it itself,
and every tensor made while it was on (a dataset's tensors, a model builder's parameters) is an
"inference tensor" that autograd refuses to save for backward until it is cloned outside that mode.
Nodes that only read a model (Evaluate, Predict) keep inference mode, in our executor too.

ComfyUI re-executes a node when its inputs or its ``IS_CHANGED`` value change and reuses the cached
output otherwise. The rule here: a node with a fixed seed is deterministic, so an unchanged graph may
reuse its cached result; ``seed -1`` (unseeded) asks for a fresh result, so ``IS_CHANGED`` answers NaN
(never equal to itself), which makes ComfyUI run the node again on every queue.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any


def always_rerun() -> float:
    """A fresh NaN: ComfyUI never finds it equal to the cached value, so the node runs again.

    Fresh on every call: Python hashes a NaN by its identity, and compares containers by identity
    first, so one shared NaN object would match itself and let ComfyUI reuse the cached output.
    """
    return float("nan")


@contextlib.contextmanager
def autograd() -> Iterator[None]:
    """Leave the host's inference mode / no_grad for the block (training needs a graph for backward)."""
    import torch

    with torch.inference_mode(False), torch.enable_grad():
        yield


@contextlib.contextmanager
def inference() -> Iterator[None]:
    """Inference mode for the block (a no-op when the host already runs the node in it)."""
    import torch

    with torch.inference_mode():
        yield


def trainable(t: Any) -> Any:
    """``t``, or a normal copy of it when it was made in inference mode (autograd cannot save those).

    Call it outside inference mode (inside :func:`autograd`): a clone made there is a normal tensor.
    """
    return t.clone() if t.is_inference() else t


def seed_rerun_key(seed: Any) -> Any:
    """The ``IS_CHANGED`` part for a node's ``seed`` input: NaN when unseeded (-1), else a constant."""
    try:
        unseeded = seed is not None and int(seed) < 0
    except (TypeError, ValueError):
        unseeded = False
    return always_rerun() if unseeded else ""


def combine(*keys: Any) -> Any:
    """One ``IS_CHANGED`` value from several parts: a fresh NaN if any part asks to re-run."""
    if any(isinstance(k, float) and k != k for k in keys):
        return always_rerun()
    return keys[0] if len(keys) == 1 else tuple(keys)


def file_key(path: Any) -> Any:
    """The ``IS_CHANGED`` part for an input file: its mtime (NaN when missing, so the error shows again)."""
    p = str(path or "").strip()
    if not p:
        return ""
    try:
        return os.stat(os.path.expanduser(p)).st_mtime_ns
    except OSError:
        return always_rerun()
