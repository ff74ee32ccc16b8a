"""Layer specs: a small list of layer dicts -> a validated, fully resolved list -> ``nn.Sequential``.

A spec such as ``[{"type": "Linear", "in": "auto", "out": 32}, {"type": "ReLU"}]`` is checked layer by
layer with errors that name the layer and what to fix. ``"auto"`` sizes (Linear ``in``, Conv ``in``,
BatchNorm/LayerNorm features) are filled from the shape the previous layers produce, which a forward
pass on the ``meta`` device computes without allocating memory. The resolved list (canonical torch
argument names, concrete numbers) is what a model's ``xpu_spec`` stores, so rebuilding never needs the
dataset again. The MLP and CNN builders produce such lists too.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

AUTO = "auto"


@dataclass(frozen=True)
class LayerKind:
    """How one layer type is written in a spec and built."""

    aliases: dict[str, str]  # accepted key -> torch argument name
    kinds: dict[str, str]  # torch argument -> "int" | "float" | "bool" | "ints" | "dim"
    required: tuple[str, ...] = ()
    # torch argument -> function of the input shape (without batch) giving its value for "auto".
    auto: dict[str, Callable[[tuple[int, ...]], int]] = field(default_factory=dict)


def _last(shape: tuple[int, ...]) -> int:
    return int(shape[-1])


def _first(shape: tuple[int, ...]) -> int:
    return int(shape[0])


_CONV_ALIASES = {"in": "in_channels", "in_channels": "in_channels", "out": "out_channels",
                 "out_channels": "out_channels", "kernel": "kernel_size", "kernel_size": "kernel_size",
                 "stride": "stride", "padding": "padding", "dilation": "dilation", "groups": "groups",
                 "bias": "bias"}
_CONV_KINDS = {"in_channels": "int", "out_channels": "int", "kernel_size": "ints", "stride": "ints",
               "padding": "ints", "dilation": "ints", "groups": "int", "bias": "bool"}
_POOL_ALIASES = {"kernel": "kernel_size", "kernel_size": "kernel_size", "stride": "stride", "padding": "padding"}
_POOL_KINDS = {"kernel_size": "ints", "stride": "ints", "padding": "ints"}
_BN_ALIASES = {"features": "num_features", "num_features": "num_features", "in": "num_features",
               "eps": "eps", "momentum": "momentum"}
_BN_KINDS = {"num_features": "int", "eps": "float", "momentum": "float"}
_NO_ARGS = LayerKind({}, {})

LAYERS: dict[str, LayerKind] = {
    "Linear": LayerKind(
        {"in": "in_features", "in_features": "in_features", "out": "out_features",
         "out_features": "out_features", "bias": "bias"},
        {"in_features": "int", "out_features": "int", "bias": "bool"},
        ("in_features", "out_features"), {"in_features": _last},
    ),
    "Conv1d": LayerKind(_CONV_ALIASES, _CONV_KINDS, ("in_channels", "out_channels", "kernel_size"),
                        {"in_channels": _first}),
    "Conv2d": LayerKind(_CONV_ALIASES, _CONV_KINDS, ("in_channels", "out_channels", "kernel_size"),
                        {"in_channels": _first}),
    "MaxPool1d": LayerKind(_POOL_ALIASES, _POOL_KINDS, ("kernel_size",)),
    "MaxPool2d": LayerKind(_POOL_ALIASES, _POOL_KINDS, ("kernel_size",)),
    "AvgPool1d": LayerKind(_POOL_ALIASES, _POOL_KINDS, ("kernel_size",)),
    "AvgPool2d": LayerKind(_POOL_ALIASES, _POOL_KINDS, ("kernel_size",)),
    "AdaptiveAvgPool1d": LayerKind({"size": "output_size", "out": "output_size", "output_size": "output_size"},
                                   {"output_size": "ints"}, ("output_size",)),
    "AdaptiveAvgPool2d": LayerKind({"size": "output_size", "out": "output_size", "output_size": "output_size"},
                                   {"output_size": "ints"}, ("output_size",)),
    "BatchNorm1d": LayerKind(_BN_ALIASES, _BN_KINDS, ("num_features",), {"num_features": _first}),
    "BatchNorm2d": LayerKind(_BN_ALIASES, _BN_KINDS, ("num_features",), {"num_features": _first}),
    "LayerNorm": LayerKind({"shape": "normalized_shape", "normalized_shape": "normalized_shape",
                            "in": "normalized_shape", "features": "normalized_shape", "eps": "eps"},
                           {"normalized_shape": "int", "eps": "float"}, ("normalized_shape",),
                           {"normalized_shape": _last}),
    "Dropout": LayerKind({"p": "p"}, {"p": "float"}),
    "Dropout1d": LayerKind({"p": "p"}, {"p": "float"}),
    "Dropout2d": LayerKind({"p": "p"}, {"p": "float"}),
    "Flatten": LayerKind({"start_dim": "start_dim", "end_dim": "end_dim"}, {"start_dim": "dim", "end_dim": "dim"}),
    "ReLU": _NO_ARGS,
    "GELU": _NO_ARGS,
    "Tanh": _NO_ARGS,
    "Sigmoid": _NO_ARGS,
    "SiLU": _NO_ARGS,
    "Identity": _NO_ARGS,
    "LeakyReLU": LayerKind({"negative_slope": "negative_slope", "slope": "negative_slope"},
                           {"negative_slope": "float"}),
    "ELU": LayerKind({"alpha": "alpha"}, {"alpha": "float"}),
    "Softmax": LayerKind({"dim": "dim"}, {"dim": "dim"}),
    "LogSoftmax": LayerKind({"dim": "dim"}, {"dim": "dim"}),
}
_BY_LOWER = {k.lower(): k for k in LAYERS}


class LayerSpecError(ValueError):
    """A layer spec that cannot be built; the message names the layer and what to fix."""


def parse_layers(text: str | list[Any]) -> list[dict[str, Any]]:
    """Parse a layer spec written as JSON or YAML: a list of dicts, or ``{"layers": [...]}``."""
    if isinstance(text, list):
        data: Any = text
    else:
        src = str(text).strip()
        if not src:
            raise LayerSpecError('the layer spec is empty: write a list like [{"type": "Linear", "in": 64, "out": 10}]')
        try:
            data = json.loads(src)
        except json.JSONDecodeError as jexc:
            try:
                import yaml

                data = yaml.safe_load(src)
            except Exception as yexc:
                raise LayerSpecError(
                    f"the layer spec is neither JSON ({jexc.msg} at line {jexc.lineno} column {jexc.colno}) "
                    f"nor YAML ({str(yexc).splitlines()[0]})"
                ) from None
    if isinstance(data, dict) and "layers" in data:
        data = data["layers"]
    if not isinstance(data, list) or not data:
        raise LayerSpecError(f"the layer spec must be a non-empty list of layers, got {type(data).__name__}")
    for i, layer in enumerate(data, start=1):
        if not isinstance(layer, dict):
            raise LayerSpecError(f"layer {i}: each layer must be a dict with a 'type', got {layer!r}")
    return data


def _coerce(value: Any, kind: str, where: str, key: str) -> Any:
    def bad(expect: str) -> LayerSpecError:
        return LayerSpecError(f"{where}: {key!r} must be {expect}, got {value!r}")

    if kind == "bool":
        if isinstance(value, bool):
            return value
        raise bad("true or false")
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad("a number")
        return float(value)
    if kind == "dim":
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad("an integer dimension")
        return int(value)
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise bad("a positive integer")
        return int(value)
    if kind == "ints":  # kernel/stride/padding: int or list of ints
        if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                                                      for v in value):
            return [int(v) for v in value]
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return int(value)
        raise bad("a non-negative integer or a list of them")
    raise AssertionError(kind)


def _normalise(index: int, layer: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Canonical type name and torch arguments of one spec layer (``"auto"`` kept)."""
    raw_type = layer.get("type")
    if not isinstance(raw_type, str) or not raw_type:
        raise LayerSpecError(f"layer {index}: missing 'type' (one of: {', '.join(LAYERS)})")
    name = _BY_LOWER.get(raw_type.lower().removeprefix("nn."))
    if name is None:
        close = difflib.get_close_matches(raw_type, list(LAYERS), n=1, cutoff=0.6)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise LayerSpecError(f"layer {index}: unknown type {raw_type!r}{hint}; known types: {', '.join(LAYERS)}")
    kind = LAYERS[name]
    where = f"layer {index} ({name})"
    args: dict[str, Any] = {}
    for key, value in layer.items():
        if key == "type":
            continue
        target = kind.aliases.get(key)
        if target is None:
            accepted = ", ".join(sorted(kind.aliases)) or "no arguments"
            raise LayerSpecError(f"{where}: unknown key {key!r}; accepted: {accepted}")
        if target in args:
            raise LayerSpecError(f"{where}: {target!r} is given twice")
        if value == AUTO or (type(value) is int and value == 0 and target in kind.auto):
            if target not in kind.auto:
                raise LayerSpecError(f"{where}: {key!r} cannot be 'auto'")
            args[target] = AUTO
        else:
            args[target] = _coerce(value, kind.kinds[target], where, key)
    for req in kind.required:
        if req not in args:
            short = next((a for a, t in kind.aliases.items() if t == req and a != req), req)
            hint = " (or 'auto')" if req in kind.auto else ""
            raise LayerSpecError(f"{where}: missing {short!r} ({req}){hint}")
    return name, args


_SAMPLE_DIMS = {"Conv1d": 2, "Conv2d": 3, "BatchNorm2d": 3, "MaxPool2d": 3, "AvgPool2d": 3, "MaxPool1d": 2,
                "AvgPool1d": 2}


def _check_fit(where: str, name: str, args: dict[str, Any], shape: tuple[int, ...]) -> None:
    """The common mismatches, said in the spec's own words (torch's messages speak of batched matrices)."""
    want_dims = _SAMPLE_DIMS.get(name)
    if want_dims is not None and len(shape) != want_dims:
        layout = "C x L" if want_dims == 2 else "C x H x W"
        raise LayerSpecError(f"{where} needs {layout} inputs per sample, but its input has shape {list(shape)}"
                             + (" (add a Flatten before Linear layers, or use image data)" if len(shape) == 1 else ""))
    if name == "Linear" and shape[-1] != args["in_features"]:
        raise LayerSpecError(f"{where} expects {args['in_features']} input features but the previous layers give "
                             f"{shape[-1]} (input shape {list(shape)}); set 'in' to {shape[-1]} or 'auto'")
    if name in ("Conv1d", "Conv2d") and shape[0] != args["in_channels"]:
        raise LayerSpecError(f"{where} expects {args['in_channels']} input channels but receives {shape[0]} "
                             f"(input shape {list(shape)}); set 'in' to {shape[0]} or 'auto'")


def resolve_layers(spec: str | list[Any], input_shape: list[int] | None) -> list[dict[str, Any]]:
    """Validate a spec and fill every ``"auto"``; return ``[{"type": ..., <torch args>}, ...]``.

    With ``input_shape`` (without batch) known, a meta-device forward pass checks that every layer
    accepts what the previous one produces.
    """
    import torch
    from torch import nn

    layers = parse_layers(spec)
    shape: tuple[int, ...] | None = tuple(int(d) for d in input_shape) if input_shape else None
    x = torch.empty((2, *shape), device="meta") if shape is not None else None
    resolved: list[dict[str, Any]] = []
    for i, layer in enumerate(layers, start=1):
        name, args = _normalise(i, layer)
        where = f"layer {i} ({name})"
        for key, value in list(args.items()):
            if value == AUTO:
                if shape is None:
                    raise LayerSpecError(f"{where}: {key} is 'auto' but the input shape is unknown; connect "
                                         f"the Dataset's info or write a number")
                args[key] = LAYERS[name].auto[key](shape)
        entry = {"type": name, **args}
        if shape is not None:
            _check_fit(where, name, args, shape)
        if x is not None:
            try:
                with torch.device("meta"):
                    module = getattr(nn, name)(**args)
                x = module(x)
            except Exception as exc:
                msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise LayerSpecError(f"{where} does not fit its input of shape {list(shape or ())} "
                                     f"(per sample): {msg}") from None
            shape = tuple(int(d) for d in x.shape[1:])
        else:
            try:
                with torch.device("meta"):
                    getattr(nn, name)(**args)
            except Exception as exc:
                raise LayerSpecError(f"{where}: {exc}") from None
        resolved.append(entry)
    return resolved


def output_shape(resolved: list[dict[str, Any]], input_shape: list[int]) -> list[int]:
    """Per-sample output shape of a resolved spec (meta-device forward)."""
    import torch

    with torch.device("meta"):
        net = build_sequential(resolved)
        y = net(torch.empty((2, *input_shape)))
    return [int(d) for d in y.shape[1:]]


def check_resolved(resolved: list[dict[str, Any]]) -> None:
    """Refuse a layer list that is not a resolved spec: an unknown type or an ``"auto"`` size left."""
    for i, entry in enumerate(resolved, start=1):
        name = entry["type"]
        if name not in LAYERS:
            raise LayerSpecError(f"layer {i}: unknown type {name!r}")
        if any(v == AUTO for k, v in entry.items() if k != "type"):
            raise LayerSpecError(f"layer {i} ({name}): unresolved 'auto' size")


def build_sequential(resolved: list[dict[str, Any]]) -> Any:
    """``nn.Sequential`` from a resolved spec (every size concrete)."""
    from .lib.layers import build_layers

    check_resolved(resolved)
    return build_layers(resolved)
