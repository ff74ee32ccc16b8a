"""The first half of an exported script's library (``xpufleet export``, docs/nodes.md; server/run/export.py):
devices, seeds and files, the Dataset and DataLoader nodes, the model builders. export_train.py holds
the second half (loss, precision, TrainingLoop, Evaluate, ModelSaver, ModelLoader, Predict).

``export.py`` copies the code after the marker line of both files into every script it writes, so a
script needs torch, numpy, scikit-learn and safetensors but not xpufleet. Each function does what one
node does, the same way (same splits, normalisation, layer order, random draws, loss adaptation, loop
arithmetic), so a script reaches the graph's metrics with the same seed; the tests compare every
example's script with the graph run and these functions with the nodes.

Importing this module imports torch: nothing in the package imports it (the generator reads the text).
"""

from __future__ import annotations

# --- the script library starts here (copied verbatim into exported scripts) ---
import contextlib
import copy
import csv
import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# ---------------------------------------------------------------------------------------------------
# Devices, seeds, files
# ---------------------------------------------------------------------------------------------------

DEFAULT_DEVICE = "cpu"  # set by main() from --device
RUN_SEED = None  # set by main() from --seed: overrides every node's seed, like a run's seed
OUTPUTS = Path("outputs")  # set by main() from --outputs: where relative model paths go
RUN_DIR = Path("run")  # set by main() from --run-dir: checkpoints, TensorBoard files, location run_dir


def warn(kind, message):
    print(f"warning ({kind}): {message}", flush=True)


def available_devices():
    out = ["cpu"]
    if torch.cuda.is_available():
        out += [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    if getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        out += [f"xpu:{i}" for i in range(torch.xpu.device_count())]
    if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        out.append("mps")
    return out


def pick_default_device(requested):
    """--device: auto = the first accelerator, else the CPU."""
    offered = available_devices()
    if requested in (None, "", "auto"):
        return next((d for d in offered if d != "cpu"), "cpu")
    want = requested if ":" in requested or requested in ("cpu", "mps") else f"{requested}:0"
    if want in offered:
        return want
    warn("device_fallback", f"--device {requested}: this machine offers {', '.join(offered)}, so the script runs on cpu")
    return "cpu"


def device_for(requested, label):
    """A node's device parameter: auto = --device; a device this machine lacks falls back to it."""
    if requested in (None, "", "auto"):
        return torch.device(DEFAULT_DEVICE)
    if requested == "cpu":
        return torch.device("cpu")
    offered = available_devices()
    kind = requested.split(":")[0]
    found = requested if requested in offered else None
    if found is None and ":" not in requested:
        found = next((d for d in offered if d.split(":")[0] == kind), None)
    if found is None:
        warn("device_fallback", f"Node {label} is set to device {requested}; this machine offers "
             f"{', '.join(offered)}, so it runs on {DEFAULT_DEVICE}.")
        found = DEFAULT_DEVICE
    return torch.device(found)


def seed_for(node_seed):
    """The run seed when given (--seed), else the node's (-1 = unseeded)."""
    if RUN_SEED is not None:
        return int(RUN_SEED)
    if node_seed is None or int(node_seed) < 0:
        return None
    return int(node_seed)


def output_path(filename, location="outputs"):
    p = Path(os.path.expanduser(str(filename).strip()))
    if p.is_absolute():
        return p
    return (RUN_DIR if location == "run_dir" else OUTPUTS) / p


def write_atomic(path, write):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


# ---------------------------------------------------------------------------------------------------
# Dataset node: load, split with the seed, normalise with the train statistics
# ---------------------------------------------------------------------------------------------------


def _classes_of(values):
    found, inverse = np.unique(np.asarray(values), return_inverse=True)
    return inverse.astype(np.int64), [str(v) for v in found.tolist()]


def _bundled(name, as_image, image_size):
    from sklearn import datasets as skd

    bunch = {"digits": skd.load_digits, "iris": skd.load_iris, "wine": skd.load_wine,
             "breast_cancer": skd.load_breast_cancer, "diabetes": skd.load_diabetes}[name]()
    x = np.asarray(bunch.data, dtype=np.float32)
    if name == "diabetes":
        return x, np.asarray(bunch.target, dtype=np.float32).reshape(-1, 1), "regression", [x.shape[1]], None, False
    y = np.asarray(bunch.target, dtype=np.int64)
    names = [str(n) for n in getattr(bunch, "target_names", range(int(y.max()) + 1))]
    if name == "digits" and (as_image or image_size):
        return x.reshape(-1, 1, 8, 8), y, "classification", [1, 8, 8], names, True
    return x, y, "classification", [x.shape[1]], names, False


def _synthetic(name, seed, n, n_features, num_classes, image_size, channels, seq_len, noise):
    rng = np.random.default_rng(seed)
    if name == "synthetic_classification":
        from sklearn.datasets import make_classification

        informative = max(2, min(n_features, math.ceil(math.log2(num_classes * 2)) + 2))
        x, y = make_classification(n_samples=n, n_features=n_features, n_informative=informative, n_redundant=0,
                                   n_classes=num_classes, n_clusters_per_class=1,
                                   flip_y=min(max(noise, 0.0), 1.0) * 0.1, random_state=seed)
        return (x.astype(np.float32), y.astype(np.int64), "classification", [n_features],
                [str(i) for i in range(num_classes)], False)
    if name == "synthetic_regression":
        from sklearn.datasets import make_regression

        x, y = make_regression(n_samples=n, n_features=n_features, n_informative=max(1, n_features // 2),
                               noise=max(noise, 0.0) * 10.0, random_state=seed)
        return x.astype(np.float32), y.astype(np.float32).reshape(-1, 1), "regression", [n_features], None, False
    if name == "synthetic_images":
        size = int(image_size) or 16
        templates = rng.standard_normal((num_classes, channels, size, size)).astype(np.float32)
        y = rng.integers(0, num_classes, size=n).astype(np.int64)
        x = templates[y] + rng.standard_normal((n, channels, size, size)).astype(np.float32) * max(noise, 0.0) * 10
        return (x.astype(np.float32), y, "classification", [channels, size, size],
                [str(i) for i in range(num_classes)], True)
    length = int(seq_len) or 32  # synthetic_sequences
    y = rng.integers(0, num_classes, size=n).astype(np.int64)
    t = np.arange(length, dtype=np.float32)[None, :, None]
    freq = (1.0 + y.astype(np.float32))[:, None, None] * (2 * np.pi / length)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, n_features)).astype(np.float32)
    x = np.sin(freq * t + phase) + rng.standard_normal((n, length, n_features)).astype(np.float32) * max(noise, 0.0)
    return (x.astype(np.float32), y, "classification", [length, n_features], [str(i) for i in range(num_classes)],
            False)


def _task_of(values, requested):
    if requested in ("classification", "regression"):
        return requested
    try:
        nums = [float(v) for v in values]
    except ValueError:
        return "classification"
    integral = all(math.isfinite(v) and v == int(v) for v in nums)
    return "classification" if integral and len(set(nums)) <= 50 else "regression"


def _csv(path, target_column, task):
    with open(os.path.expanduser(path), newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.reader(fh))
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if any(cell.strip() for cell in r)]
    t_idx = header.index(target_column)
    feat_idx = [i for i in range(len(header)) if i != t_idx]
    x = np.asarray([[float(row[i].strip()) for i in feat_idx] for row in body], dtype=np.float32)
    targets = [row[t_idx].strip() for row in body]
    task = _task_of(targets, task)
    if task == "classification":
        y, classes = _classes_of(targets)
        try:  # numeric labels sort numerically
            order = sorted({float(v) for v in targets})
            classes = [next(t for t in targets if float(t) == v) for v in order]
            lookup = {float(c): i for i, c in enumerate(classes)}
            y = np.asarray([lookup[float(t)] for t in targets], dtype=np.int64)
        except ValueError:
            pass
        return x, y, task, [x.shape[1]], classes, False
    return x, np.asarray([float(t) for t in targets], dtype=np.float32).reshape(-1, 1), task, [x.shape[1]], None, False


def _safetensors_data(path, x_key, y_key, task):
    from safetensors.numpy import load_file

    tensors = load_file(os.path.expanduser(path))
    x = np.asarray(tensors[x_key]).astype(np.float32)
    y = np.asarray(tensors[y_key])
    if task == "auto":
        task = "classification" if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_ else "regression"
    if task == "classification":
        labels, classes = _classes_of(y)
        return x, labels, task, list(x.shape[1:]), classes, x.ndim == 4
    return x, y.astype(np.float32).reshape(y.shape[0], -1), task, list(x.shape[1:]), None, x.ndim == 4


def split_indices(n, val_split, seed, labels=None):
    """Train/val indices: stratified by the labels when every class has at least two samples."""
    n_val = int(round(n * float(val_split)))
    if val_split > 0 and n_val == 0:
        n_val = 1
    idx = np.arange(n)
    if n_val == 0:
        return idx, idx[:0]
    from sklearn.model_selection import train_test_split

    stratify = None
    if labels is not None:
        _, counts = np.unique(labels, return_counts=True)
        if counts.min() >= 2 and n_val >= len(counts) and n - n_val >= len(counts):
            stratify = labels
    train, val = train_test_split(idx, test_size=n_val, random_state=seed, stratify=stratify)
    return np.sort(train), np.sort(val)


def load_dataset(name, val_split=0.2, seed=0, normalize="standard", as_image=False, n_samples=1000, n_features=20,
                 num_classes=2, image_size=0, channels=1, seq_len=0, noise=0.1, path="", target_column="target",
                 x_key="x", y_key="y", task="auto"):
    """The Dataset node: (train, val, info)."""
    if name in ("digits", "iris", "wine", "breast_cancer", "diabetes"):
        x, y, task, shape, classes, is_image = _bundled(name, as_image, image_size)
    elif name.startswith("synthetic_"):
        x, y, task, shape, classes, is_image = _synthetic(name, seed, int(n_samples), int(n_features),
                                                          int(num_classes), image_size, int(channels), seq_len, noise)
    elif name == "csv":
        x, y, task, shape, classes, is_image = _csv(path, target_column, task)
    else:
        x, y, task, shape, classes, is_image = _safetensors_data(path, x_key, y_key, task)
    if is_image and image_size and name == "digits" and int(image_size) != 8:
        x = F.interpolate(torch.from_numpy(x), size=(int(image_size),) * 2, mode="bilinear",
                          align_corners=False).numpy()
        shape = [1, int(image_size), int(image_size)]
    train_idx, val_idx = split_indices(int(x.shape[0]), val_split, seed, y if task == "classification" else None)
    x_train, x_val = x[train_idx], x[val_idx]
    if normalize != "none":
        axis = None if is_image else 0  # images: one statistic over all pixels
        if normalize == "standard":
            shift = x_train.mean(axis=axis, keepdims=axis is None)
            scale = x_train.std(axis=axis, keepdims=axis is None)
        else:
            shift = x_train.min(axis=axis, keepdims=axis is None)
            scale = x_train.max(axis=axis, keepdims=axis is None) - shift
        scale = np.where(scale > 1e-12, scale, 1.0).astype(np.float32)
        x_train, x_val = (x_train - shift) / scale, (x_val - shift) / scale
    y_dtype = torch.long if task == "classification" else torch.float32
    num_classes = len(classes) if task == "classification" and classes else 0
    info = {"name": name, "task": task, "input_shape": [int(d) for d in shape], "num_features": int(np.prod(shape)),
            "num_classes": num_classes, "classes": classes,
            "out_features": num_classes or (int(y.shape[1]) if task == "regression" else 1),
            "n_train": int(len(train_idx)), "n_val": int(len(val_idx))}

    def make(xs, idx):
        return TensorDataset(torch.from_numpy(np.ascontiguousarray(xs, dtype=np.float32)),
                             torch.from_numpy(np.ascontiguousarray(y[idx])).to(y_dtype))

    return make(x_train, train_idx), make(x_val, val_idx), info


def make_loader(dataset, batch_size, shuffle, num_workers=0, drop_last=False, pin_memory=False):
    """The DataLoader node."""
    return DataLoader(dataset, batch_size=int(batch_size), shuffle=bool(shuffle) and len(dataset) > 0,
                      num_workers=int(num_workers), drop_last=bool(drop_last), pin_memory=bool(pin_memory))


# ---------------------------------------------------------------------------------------------------
# Model nodes: the layer lists of the MLP and CNN builders, a Sequential from a layer list
# ---------------------------------------------------------------------------------------------------

ACTIVATIONS = {"relu": "ReLU", "gelu": "GELU", "tanh": "Tanh", "sigmoid": "Sigmoid", "leaky_relu": "LeakyReLU",
               "silu": "SiLU", "elu": "ELU"}


def mlp_layers(in_features, out_features, hidden, activation="relu", dropout=0.0, batch_norm=False):
    layers = [{"type": "Flatten"}]
    prev = int(in_features)
    for h in hidden:
        layers.append({"type": "Linear", "in_features": prev, "out_features": int(h)})
        if batch_norm:
            layers.append({"type": "BatchNorm1d", "num_features": int(h)})
        layers.append({"type": ACTIVATIONS[activation]})
        if dropout > 0:
            layers.append({"type": "Dropout", "p": float(dropout)})
        prev = int(h)
    layers.append({"type": "Linear", "in_features": prev, "out_features": int(out_features)})
    return layers


def cnn_layers(in_channels, image_size, out_features, channels, kernel_size=3, activation="relu", dropout=0.0,
               batch_norm=True, fc_hidden=0):
    h, w = int(image_size[0]), int(image_size[1])
    layers, prev = [], int(in_channels)
    for c in channels:
        layers.append({"type": "Conv2d", "in_channels": prev, "out_channels": int(c), "kernel_size": int(kernel_size),
                       "padding": int(kernel_size) // 2})
        if batch_norm:
            layers.append({"type": "BatchNorm2d", "num_features": int(c)})
        layers.append({"type": ACTIVATIONS[activation]})
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
                   {"type": ACTIVATIONS[activation]}]
        if dropout > 0:
            layers.append({"type": "Dropout", "p": float(dropout)})
        flat = int(fc_hidden)
    layers.append({"type": "Linear", "in_features": flat, "out_features": int(out_features)})
    return layers


# A layer argument left "auto": filled from the shape the previous layers give (per sample).
AUTO_SIZES = {("Linear", "in_features"): -1, ("Conv1d", "in_channels"): 0, ("Conv2d", "in_channels"): 0,
              ("BatchNorm1d", "num_features"): 0, ("BatchNorm2d", "num_features"): 0,
              ("LayerNorm", "normalized_shape"): -1}


def resolve_layers(layers, input_shape):
    """Fill every "auto" size of a layer list from the input shape (a forward pass on the meta device)."""
    x = torch.empty((2, *input_shape), device="meta") if input_shape else None
    resolved = []
    for layer in layers:
        entry = dict(layer)
        for key, value in layer.items():
            if value == "auto":
                entry[key] = int(x.shape[1:][AUTO_SIZES[(layer["type"], key)]])
        if x is not None:
            with torch.device("meta"):
                x = getattr(nn, entry["type"])(**{k: v for k, v in entry.items() if k != "type"})(x)
        resolved.append(entry)
    return resolved


def build_layers(layers):
    return nn.Sequential(*(getattr(nn, e["type"])(**{k: v for k, v in e.items() if k != "type"}) for e in layers))


def layers_of(spec):
    kwargs = spec["kwargs"]
    if spec["builder"] == "mlp":
        return mlp_layers(**kwargs)
    if spec["builder"] == "cnn":
        return cnn_layers(**kwargs)
    return kwargs["layers"]


def build_model(spec, seed=None):
    """A model from its spec (the architecture a saved file records), seeded like the builder nodes."""
    if seed is None:
        model = build_layers(layers_of(spec))
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(seed))
            model = build_layers(layers_of(spec))
    model.xpu_spec = copy.deepcopy(spec)
    return model


def model_spec(builder, kwargs, info, input_shape):
    info = info or {}
    return {"format": 1, "builder": builder, "kwargs": kwargs, "input_shape": list(input_shape) if input_shape else None,
            "task": info.get("task"), "num_classes": int(info.get("num_classes") or 0), "classes": info.get("classes")}


def mlp(info, hidden, activation="relu", dropout=0.0, seed=0, in_features=0, out_features=0, batch_norm=False):
    """The MLP node."""
    info = info or {}
    fin = int(in_features) or int(info.get("num_features") or 0)
    fout = int(out_features) or int(info.get("out_features") or 0)
    kwargs = {"in_features": fin, "out_features": fout, "hidden": list(hidden), "activation": activation,
              "dropout": float(dropout), "batch_norm": bool(batch_norm)}
    shape = info.get("input_shape") if int(info.get("num_features") or 0) == fin else [fin]
    return build_model(model_spec("mlp", kwargs, info, shape), seed_for(seed))


def cnn(info, channels, kernel_size=3, activation="relu", dropout=0.0, seed=0, in_channels=0, image_size=0,
        out_features=0, batch_norm=True, fc_hidden=0):
    """The CNN node."""
    info = info or {}
    shape = list(info.get("input_shape") or [])
    cin = int(in_channels) or (shape[0] if shape else 0)
    hw = [int(image_size)] * 2 if image_size else shape[1:]
    fout = int(out_features) or int(info.get("out_features") or 0)
    kwargs = {"in_channels": cin, "image_size": [int(hw[0]), int(hw[1])], "out_features": fout,
              "channels": list(channels), "kernel_size": int(kernel_size), "activation": activation,
              "dropout": float(dropout), "batch_norm": bool(batch_norm), "fc_hidden": int(fc_hidden)}
    return build_model(model_spec("cnn", kwargs, info, [cin, int(hw[0]), int(hw[1])]), seed_for(seed))


def sequential(info, layers, seed=0):
    """The Sequential node (``layers`` with canonical torch argument names; sizes may be "auto")."""
    info = info or {}
    shape = info.get("input_shape") or None
    return build_model(model_spec("sequential", {"layers": resolve_layers(layers, shape)}, info, shape),
                       seed_for(seed))
