"""How the built-in model server splits a model across a unit's ranks (docs/services.md): pipeline stages.

A model saved by ModelSaver is an ``nn.Sequential`` described by its ``xpu_spec`` (nodes/models.py):
a list of layers. Rank k holds and runs only stage k, a contiguous run of layers; stages are chosen so
the largest stage holds as few parameters as possible (every stage has at least one layer). Only that
stage's tensors are read from the file. Rank 0 runs stage 0 and sends the activations to rank 1, ...,
the last rank sends the result back to rank 0: the same operations on the same weights as the unsplit
model, in the same order.

:func:`stage_bounds` is pure; the rest imports torch lazily.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class SplitError(ValueError):
    """A model this unit cannot split (the text says what to change)."""


def stage_bounds(weights: Sequence[int], stages: int) -> list[tuple[int, int]]:
    """Contiguous ``[start, end)`` layer ranges, one per stage, minimising the largest stage's weight
    (ties: the most even layer counts). ``weights``: parameters per layer."""
    n = len(weights)
    if stages < 1:
        raise SplitError("a unit has at least one rank")
    if n < stages:
        raise SplitError(f"the model has {n} layer(s): a unit of {stages} cannot give every rank a pipeline "
                         f"stage; use a unit of at most {n}")
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + int(w))

    def cost(a: int, b: int) -> int:
        return prefix[b] - prefix[a]

    inf = float("inf")

    def table(limit: float | None) -> tuple[list[list[float]], list[list[int]]]:
        """best[k][i] over splits of the first i layers into k stages: the largest stage weight
        (``limit`` None), else the longest stage among splits whose stages weigh at most ``limit``."""
        best = [[inf] * (n + 1) for _ in range(stages + 1)]
        cut = [[0] * (n + 1) for _ in range(stages + 1)]
        best[0][0] = 0
        for k in range(1, stages + 1):
            for i in range(k, n - (stages - k) + 1):
                for j in range(k - 1, i):
                    if best[k - 1][j] == inf or (limit is not None and cost(j, i) > limit):
                        continue
                    value = max(best[k - 1][j], cost(j, i) if limit is None else i - j)
                    if value < best[k][i]:
                        best[k][i], cut[k][i] = value, j
        return best, cut

    weight_best, _ = table(None)
    _, cut = table(weight_best[stages][n])  # the lightest largest stage, then the most even lengths
    bounds: list[tuple[int, int]] = []
    i = n
    for k in range(stages, 0, -1):
        j = cut[k][i]
        bounds.append((j, i))
        i = j
    return bounds[::-1]


@dataclass
class Stage:
    """One rank's part of the model."""

    module: Any  # nn.Sequential of the stage's layers, eval mode
    start: int
    end: int
    layers: int
    parameters: int
    input_shape: list[int] | None
    task: str | None
    classes: list[Any] | None

    def describe(self) -> dict[str, Any]:
        return {"layers": [self.start, self.end], "of": self.layers, "parameters": self.parameters}


def read_spec(path: Path) -> dict[str, Any]:
    """The ``xpu_spec`` of a saved model (safetensors header or PyTorch file)."""
    from ...nodes.io import read_model_file

    if path.suffix.lower() == ".safetensors":
        import json

        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as fh:
                raw = (fh.metadata() or {}).get("xpu_spec")
        except Exception as exc:
            raise SplitError(f"cannot read safetensors file {path}: {exc}") from None
        spec = json.loads(raw) if raw and raw != "null" else None
    else:
        spec, _ = read_model_file(path)
    if not isinstance(spec, dict):
        raise SplitError(f"{path} holds weights but no architecture spec (xpu_spec): save models built by the "
                         f"MLP/CNN/Sequential nodes with ModelSaver")
    return spec


def _layer_weights(layers: list[dict[str, Any]]) -> list[int]:
    import torch

    from ...nodes.layerspec import build_sequential

    with torch.device("meta"):
        model = build_sequential(layers)
    return [sum(p.numel() for p in layer.parameters()) for layer in model]


def _stage_state(path: Path, start: int, end: int) -> dict[str, Any]:
    """The stage's tensors only, renamed from the full model's ``<i>.weight`` to the stage's."""

    def wanted(key: str) -> tuple[int, str] | None:
        head, _, rest = key.partition(".")
        return (int(head) - start, rest) if head.isdigit() and start <= int(head) < end else None

    out: dict[str, Any] = {}
    if path.suffix.lower() == ".safetensors":
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as fh:
            for key in fh.keys():
                w = wanted(key)
                if w is not None:
                    out[f"{w[0]}.{w[1]}"] = fh.get_tensor(key)
        return out
    from ...nodes.io import read_model_file

    _, state = read_model_file(path)
    for key, tensor in state.items():
        w = wanted(key)
        if w is not None:
            out[f"{w[0]}.{w[1]}"] = tensor
    return out


def load_stage(path: Path, rank: int, size: int) -> Stage:
    """Rank ``rank``'s pipeline stage of the model at ``path`` (a unit of ``size``)."""
    from ...nodes.layerspec import build_sequential
    from ...nodes.lib.modelfile import load_weights
    from ...nodes.models import layers_of

    spec = read_spec(path)
    layers = layers_of(spec)
    bounds = stage_bounds(_layer_weights(layers), size)
    start, end = bounds[rank]
    module = load_weights(build_sequential(layers[start:end]), _stage_state(path, start, end), path, SplitError)
    return Stage(module=module, start=start, end=end, layers=len(layers),
                 parameters=sum(p.numel() for p in module.parameters()),
                 input_shape=list(spec["input_shape"]) if spec.get("input_shape") else None,
                 task=spec.get("task"), classes=spec.get("classes"))
