"""The model builders' layer lists (MLP, CNN) and a model rebuilt from its ``xpu_spec`` (docs/nodes.md).
Resolved sizes in, ``nn.Sequential`` out; inlined into exported scripts (nodes/lib/__init__.py).
"""

from __future__ import annotations

# --- inlined by xpufleet export from here
import copy

SPEC_FORMAT = 1
SPEC_ATTR = "xpu_spec"
ACTIVATIONS = {"relu": "ReLU", "gelu": "GELU", "tanh": "Tanh", "sigmoid": "Sigmoid", "leaky_relu": "LeakyReLU",
               "silu": "SiLU", "elu": "ELU"}


def activation_layer(name):
    """The layer entry of activation ``name`` (a key of ACTIVATIONS)."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unknown activation {name!r}; choose one of: {', '.join(ACTIVATIONS)}")
    return {"type": ACTIVATIONS[name]}


def mlp_layers(in_features, out_features, hidden, activation="relu", dropout=0.0, batch_norm=False):
    """Flatten -> [Linear -> (BatchNorm1d) -> activation -> (Dropout)] * len(hidden) -> Linear."""
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    layers = [{"type": "Flatten"}]
    prev = int(in_features)
    for h in hidden:
        layers.append({"type": "Linear", "in_features": prev, "out_features": int(h)})
        if batch_norm:
            layers.append({"type": "BatchNorm1d", "num_features": int(h)})
        layers.append(activation_layer(activation))
        if dropout > 0:
            layers.append({"type": "Dropout", "p": float(dropout)})
        prev = int(h)
    layers.append({"type": "Linear", "in_features": prev, "out_features": int(out_features)})
    return layers


def cnn_layers(in_channels, image_size, out_features, channels, kernel_size=3, activation="relu", dropout=0.0,
               batch_norm=True, fc_hidden=0):
    """[Conv2d -> (BatchNorm2d) -> activation -> MaxPool2d(2) while the image is >= 2 px] -> Flatten -> head."""
    if kernel_size < 1 or kernel_size % 2 == 0:
        raise ValueError(f"kernel_size must be an odd positive integer (so 'same' padding keeps the size), "
                         f"got {kernel_size}")
    if not channels:
        raise ValueError("channels: give at least one convolution, e.g. '16,32'")
    if not 0.0 <= float(dropout) < 1.0:
        raise ValueError(f"dropout must be in [0, 1), got {dropout}")
    h, w = int(image_size[0]), int(image_size[1])
    layers = []
    prev = int(in_channels)
    for c in channels:
        layers.append({"type": "Conv2d", "in_channels": prev, "out_channels": int(c),
                       "kernel_size": int(kernel_size), "padding": int(kernel_size) // 2})
        if batch_norm:
            layers.append({"type": "BatchNorm2d", "num_features": int(c)})
        layers.append(activation_layer(activation))
        if h >= 2 and w >= 2:
            layers.append({"type": "MaxPool2d", "kernel_size": 2})
            h, w = h // 2, w // 2
        prev = int(c)
    layers.append({"type": "Flatten"})
    if dropout > 0:
        layers.append({"type": "Dropout", "p": float(dropout)})
    flat = prev * h * w
    if fc_hidden:
        layers += [{"type": "Linear", "in_features": flat, "out_features": int(fc_hidden)},
                   activation_layer(activation)]
        if dropout > 0:
            layers.append({"type": "Dropout", "p": float(dropout)})
        flat = int(fc_hidden)
    layers.append({"type": "Linear", "in_features": flat, "out_features": int(out_features)})
    return layers


BUILDERS = {"mlp": mlp_layers, "cnn": cnn_layers, "sequential": lambda layers: layers}


def layers_of(spec):
    """The resolved layer list a model spec describes."""
    builder = spec.get("builder")
    if builder not in BUILDERS:
        raise ValueError(f"model spec has unknown builder {builder!r}; known: {', '.join(BUILDERS)}")
    return BUILDERS[builder](**spec.get("kwargs", {}))


def make_spec(builder, kwargs, info, input_shape):
    """The ``xpu_spec`` dict a builder node attaches to its model (JSON-serialisable)."""
    info = info or {}
    return {"format": SPEC_FORMAT, "builder": builder, "kwargs": kwargs,
            "input_shape": list(input_shape) if input_shape else None, "task": info.get("task"),
            "num_classes": int(info.get("num_classes") or 0), "classes": info.get("classes")}


def build_layers(layers):
    """``nn.Sequential`` of a resolved layer list (every size concrete)."""
    from torch import nn

    return nn.Sequential(*(getattr(nn, e["type"])(**{k: v for k, v in e.items() if k != "type"}) for e in layers))


def build_model(spec, seed=None):
    """A model rebuilt from its ``xpu_spec`` (weights freshly initialised; seeded when ``seed`` is given)."""
    import torch

    if not isinstance(spec, dict) or spec.get("format", SPEC_FORMAT) > SPEC_FORMAT:
        raise ValueError(f"unsupported model spec {spec!r:.200}")
    layers = layers_of(spec)
    if seed is None:
        model = build_layers(layers)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = build_layers(layers)
    setattr(model, SPEC_ATTR, copy.deepcopy(spec))
    return model
