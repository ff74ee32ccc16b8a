"""Model builder nodes (docs/nodes.md): MLP, small CNN, and a Sequential from a layer spec.

Every model these nodes make is an ``nn.Sequential`` carrying ``xpu_spec``: the builder name and its
fully resolved arguments (plus input shape, task and classes). ``build_model(spec)`` rebuilds the same
architecture from it, which is how ModelSaver/ModelLoader round-trip a model losslessly and how the
memory estimator can build it on the meta device. Sizes left at 0/"auto" come from the Dataset's info.
"""

from __future__ import annotations

import re
from typing import Any

from . import hostmode, runtime
from . import types as T
from .contract import Node, float_widget, int_widget, socket, widget
from .layerspec import LayerSpecError, check_resolved, output_shape, resolve_layers
from .lib import layers
from .lib.layers import SPEC_ATTR, SPEC_FORMAT, cnn_layers, layers_of, make_spec, mlp_layers

__all__ = ["SPEC_ATTR", "SPEC_FORMAT", "XPUCNN", "XPUMLP", "XPUSequential", "build_model", "cnn_layers", "layers_of",
           "make_spec", "mlp_layers", "parse_sizes", "resolve_seed", "spec_of"]


def parse_sizes(text: str | list[int], what: str = "hidden") -> list[int]:
    """``"64,32"`` -> ``[64, 32]``; empty -> ``[]``; anything else is a clear error."""
    if isinstance(text, list):
        items = text
    else:
        parts = [p for p in re.split(r"[,\s]+", str(text).strip()) if p]
        items = []
        for p in parts:
            if not re.fullmatch(r"\d+", p):
                raise ValueError(f"{what}: {p!r} is not a positive integer; write sizes like '64,32'")
            items.append(int(p))
    for v in items:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ValueError(f"{what}: sizes must be positive integers, got {v!r}")
    return list(items)


def build_model(spec: dict[str, Any], seed: int | None = None) -> Any:
    """Rebuild a model from its ``xpu_spec`` (weights freshly initialised; seeded when ``seed`` is given);
    a layer list that is not a resolved spec (unknown type, an "auto" size left) is refused first."""
    if isinstance(spec, dict) and spec.get("builder") in layers.BUILDERS and spec.get("format", SPEC_FORMAT) <= SPEC_FORMAT:
        check_resolved(layers.layers_of(spec))
    return layers.build_model(spec, seed)


def spec_of(model: Any) -> dict[str, Any] | None:
    """A model's ``xpu_spec`` (unwrapping DDP/compile wrappers), or None for a foreign module."""
    for candidate in (model, getattr(model, "module", None), getattr(model, "_orig_mod", None)):
        spec = getattr(candidate, SPEC_ATTR, None) if candidate is not None else None
        if isinstance(spec, dict):
            return spec
    return None


def resolve_seed(node_seed: int | None) -> int | None:
    """The run's seed when the run has one (sweeps vary it), else the node's (-1 = unseeded)."""
    ctx = runtime.current()
    if ctx is not None and ctx.seed is not None:
        return int(ctx.seed)
    if node_seed is None or int(node_seed) < 0:
        return None
    return int(node_seed)


def _finish(builder: str, kwargs: dict[str, Any], info: dict[str, Any] | None, input_shape: list[int] | None,
            seed: int, label: str) -> tuple[Any]:
    spec = make_spec(builder, kwargs, info, input_shape)
    model = build_model(spec, resolve_seed(seed))
    n_params = sum(p.numel() for p in model.parameters())
    runtime.info(f"{label}: {n_params:,} parameters", parameters=n_params)
    return (model,)


_SEED_INPUT = int_widget(0, -1, 2**31 - 1, "weight init seed (-1 = unseeded); a run's seed overrides it")
# What the MLP's and the CNN's blocks take after their sizes.
_BLOCK_INPUTS = {
    "activation": widget(T.ACTIVATION_CHOICES, "relu", "activation after each hidden layer"),
    "dropout": float_widget(0.0, 0.0, 0.95, 0.05, "dropout probability (0 = none)"),
    "seed": _SEED_INPUT,
}
_INFO_INPUT = socket(T.DATASET_INFO, "the Dataset's info: sizes left at 0 / auto come from it")
_OUT_FEATURES_INPUT = int_widget(0, 0, 1 << 30, "0 = from info")


class _UnseededReruns(Node):
    """ComfyUI's caching rule for builders (nodes/hostmode.py): seed -1 builds fresh weights each queue."""

    @classmethod
    def IS_CHANGED(cls, seed: int = 0, **_: Any) -> Any:
        return hostmode.seed_rerun_key(seed)


class XPUMLP(_UnseededReruns, category=T.CATEGORY_MODELS, function="build", display="MLP", returns={"model": T.MODEL}):
    """MLP builder node."""

    DESCRIPTION = ("A multi-layer perceptron. in/out features 0 = taken from the Dataset's info (inputs are "
                   "flattened, outputs = number of classes or target size).")
    REQUIRED = {"hidden": widget("STRING", "64,32", "hidden layer sizes, e.g. 128,64"), **_BLOCK_INPUTS}
    OPTIONAL = {
        "dataset_info": _INFO_INPUT,
        "in_features": int_widget(0, 0, 1 << 30, "0 = from info"),
        "out_features": _OUT_FEATURES_INPUT,
        "batch_norm": widget("BOOLEAN", False, "BatchNorm after each hidden layer"),
    }

    def build(self, hidden: str = "64,32", activation: str = "relu", dropout: float = 0.0, seed: int = 0,
              dataset_info: dict[str, Any] | None = None, in_features: int = 0, out_features: int = 0,
              batch_norm: bool = False) -> tuple[Any]:
        info = dataset_info or {}
        fin = int(in_features) or int(info.get("num_features") or 0)
        fout = int(out_features) or int(info.get("out_features") or 0)
        if not fin:
            raise ValueError("MLP: in_features is 0 and no dataset_info is connected; connect the Dataset's "
                             "info output or set in_features")
        if not fout:
            raise ValueError("MLP: out_features is 0 and no dataset_info is connected; connect the Dataset's "
                             "info output or set out_features")
        kwargs = {"in_features": fin, "out_features": fout, "hidden": parse_sizes(hidden, "MLP hidden"),
                  "activation": activation, "dropout": float(dropout), "batch_norm": bool(batch_norm)}
        mlp_layers(**kwargs)  # validate before recording
        shape = info.get("input_shape") if int(info.get("num_features") or 0) == fin else [fin]
        return _finish("mlp", kwargs, info, shape, seed, "MLP")


class XPUCNN(_UnseededReruns, category=T.CATEGORY_MODELS, function="build", display="CNN (small)",
             returns={"model": T.MODEL}):
    """Small CNN builder node (image inputs C x H x W)."""

    DESCRIPTION = ("A small convolutional network for images (C x H x W): conv blocks with 2x2 max-pooling, "
                   "then a linear head. in_channels/image_size/out_features 0 = from the Dataset's info.")
    REQUIRED = {
        "channels": widget("STRING", "16,32", "output channels of each conv block"),
        "kernel_size": int_widget(3, 1, 15, "odd convolution size (padding keeps the image size)", step=2),
        **_BLOCK_INPUTS,
    }
    OPTIONAL = {
        "dataset_info": _INFO_INPUT,
        "in_channels": int_widget(0, 0, 4096, "0 = from info"),
        "image_size": int_widget(0, 0, 8192, "0 = from info"),
        "out_features": _OUT_FEATURES_INPUT,
        "batch_norm": widget("BOOLEAN", True, "BatchNorm after each convolution"),
        "fc_hidden": int_widget(0, 0, 1 << 20, "size of a hidden linear layer in the head (0 = none)"),
    }

    def build(self, channels: str = "16,32", kernel_size: int = 3, activation: str = "relu",
              dropout: float = 0.0, seed: int = 0, dataset_info: dict[str, Any] | None = None,
              in_channels: int = 0, image_size: int = 0, out_features: int = 0, batch_norm: bool = True,
              fc_hidden: int = 0) -> tuple[Any]:
        info = dataset_info or {}
        shape = list(info.get("input_shape") or [])
        if info and len(shape) != 3:
            raise ValueError(f"CNN: the dataset's samples have shape {shape}, not C x H x W images; use an image "
                             f"dataset (digits with as_image, synthetic_images) or the MLP")
        cin = int(in_channels) or (shape[0] if shape else 0)
        hw = [int(image_size)] * 2 if image_size else (shape[1:] if shape else [])
        fout = int(out_features) or int(info.get("out_features") or 0)
        if not cin or not hw or not fout:
            raise ValueError("CNN: connect the Dataset's info or set in_channels, image_size and out_features")
        kwargs = {"in_channels": cin, "image_size": [int(hw[0]), int(hw[1])], "out_features": fout,
                  "channels": parse_sizes(channels, "CNN channels"), "kernel_size": int(kernel_size),
                  "activation": activation, "dropout": float(dropout), "batch_norm": bool(batch_norm),
                  "fc_hidden": int(fc_hidden)}
        cnn_layers(**kwargs)
        return _finish("cnn", kwargs, info, [cin, int(hw[0]), int(hw[1])], seed, "CNN")


_SEQUENTIAL_EXAMPLE = (
    '[{"type": "Flatten"},\n {"type": "Linear", "in": "auto", "out": 64},\n {"type": "ReLU"},\n'
    ' {"type": "Linear", "in": 64, "out": 10}]'
)


class XPUSequential(_UnseededReruns, category=T.CATEGORY_MODELS, function="build",
                    display="Sequential (layer spec)", returns={"model": T.MODEL}):
    """Sequential builder node: a model from a JSON/YAML layer list."""

    DESCRIPTION = ("A torch nn.Sequential from a layer list (JSON or YAML), e.g. "
                   '[{"type":"Linear","in":64,"out":32},{"type":"ReLU"}]. Sizes may be "auto" (from the '
                   "previous layer's output, given the Dataset's info). Every layer is checked with errors "
                   "that name it.")
    REQUIRED = {
        "layers": widget("STRING", _SEQUENTIAL_EXAMPLE, "a JSON or YAML list of layers; sizes may be \"auto\"",
                         multiline=True),
        "seed": _SEED_INPUT,
    }
    OPTIONAL = {"dataset_info": _INFO_INPUT}

    def build(self, layers: str, seed: int = 0, dataset_info: dict[str, Any] | None = None) -> tuple[Any]:
        info = dataset_info or {}
        shape = info.get("input_shape") or None
        try:
            resolved = resolve_layers(layers, shape)
        except LayerSpecError as exc:
            raise ValueError(f"Sequential: {exc}") from None
        if shape and info.get("out_features"):
            out = output_shape(resolved, shape)
            want = int(info["out_features"])
            if out and out[-1] != want:
                runtime.warn("model_shape", f"Sequential: the last layer gives {out[-1]} outputs per sample but the "
                             f"dataset has {want} {'classes' if info.get('task') == 'classification' else 'targets'}")
        return _finish("sequential", {"layers": resolved}, info, shape, seed, "Sequential")
