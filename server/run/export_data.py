"""The first half of an exported script's own code (``xpufleet export``, docs/export.md; server/run/export.py):
what a run's context gives the nodes (devices, seeds, where files go) and the Dataset, DataLoader and model
builder nodes as functions. export_train.py holds the second half (TrainingLoop, Evaluate, ModelSaver,
ModelLoader, Predict).

What the nodes compute is not here: these functions call the node library (``nodes/lib/``), whose
modules ``export.py`` inlines into every script before the code after the marker line of both files.
So a script needs torch, numpy, scikit-learn and safetensors but not xpufleet, and it reaches the graph's
metrics with the same seed because it runs the nodes' own code; the tests compare every example's script
with the graph run.

Importing this module imports torch: nothing in the package imports it (the generator reads the text).
"""

from __future__ import annotations

# In a script the node library precedes this code in one namespace; imported as a module (tests), from here.
from ...nodes.lib.datasets import (
    bundled_arrays,
    csv_targets,
    normalise_splits,
    read_csv_table,
    resize_images,
    safetensors_arrays,
    split_indices,
    synthetic_arrays,
)
from ...nodes.lib.layers import build_model, cnn_layers, make_spec, mlp_layers

__all__ = ["cnn", "cnn_layers", "device_for", "load_dataset", "make_loader", "mlp", "mlp_layers", "output_path",
           "seed_for", "sequential", "warn", "write_atomic"]

# --- the script library starts here (copied verbatim into exported scripts) ---
import contextlib
import os
from pathlib import Path

import numpy as np
import torch
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
# Dataset and DataLoader nodes (the arrays, the split and the normalisation: nodes/lib/datasets.py)
# ---------------------------------------------------------------------------------------------------


def load_dataset(name, val_split=0.2, seed=0, normalize="standard", as_image=False, n_samples=1000, n_features=20,
                 num_classes=2, image_size=0, channels=1, seq_len=0, noise=0.1, path="", target_column="target",
                 x_key="x", y_key="y", task="auto"):
    """The Dataset node: (train, val, info)."""
    if name in ("digits", "iris", "wine", "breast_cancer", "diabetes"):
        arrays = bundled_arrays(name, as_image, image_size)
    elif name.startswith("synthetic_"):
        arrays = synthetic_arrays(name, seed, n_samples, n_features, num_classes, image_size, channels, seq_len,
                                  noise)
    elif name == "csv":
        path = os.path.expanduser(path)
        _, x, targets = read_csv_table(path, target_column)
        y, task, classes = csv_targets(path, target_column, targets, task)
        arrays = (x, y, task, [x.shape[1]], classes, False)
    else:
        arrays = safetensors_arrays(os.path.expanduser(path), x_key, y_key, task)
    x, y, task, shape, classes, is_image = arrays
    if is_image and image_size and name == "digits" and int(image_size) != 8:
        x = resize_images(x, int(image_size))
        shape = [1, int(image_size), int(image_size)]
    train_idx, val_idx = split_indices(int(x.shape[0]), val_split, seed, y if task == "classification" else None)
    x_train, x_val = normalise_splits(x[train_idx], x[val_idx], normalize, is_image)
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
# Model nodes (the layer lists and the model: nodes/lib/layers.py)
# ---------------------------------------------------------------------------------------------------

# A layer argument left "auto": filled from the shape the previous layers give (per sample).
AUTO_SIZES = {("Linear", "in_features"): -1, ("Conv1d", "in_channels"): 0, ("Conv2d", "in_channels"): 0,
              ("BatchNorm1d", "num_features"): 0, ("BatchNorm2d", "num_features"): 0,
              ("LayerNorm", "normalized_shape"): -1}


def resolve_auto_sizes(layers, input_shape):
    """Fill every "auto" size of a checked layer list from the input shape (a forward pass on the meta
    device); the exporter checked the list with the Sequential node's own parser."""
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


def mlp(info, hidden, activation="relu", dropout=0.0, seed=0, in_features=0, out_features=0, batch_norm=False):
    """The MLP node."""
    info = info or {}
    fin = int(in_features) or int(info.get("num_features") or 0)
    fout = int(out_features) or int(info.get("out_features") or 0)
    kwargs = {"in_features": fin, "out_features": fout, "hidden": list(hidden), "activation": activation,
              "dropout": float(dropout), "batch_norm": bool(batch_norm)}
    mlp_layers(**kwargs)  # checked before it is recorded, as the node does
    shape = info.get("input_shape") if int(info.get("num_features") or 0) == fin else [fin]
    return build_model(make_spec("mlp", kwargs, info, shape), seed_for(seed))


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
    cnn_layers(**kwargs)
    return build_model(make_spec("cnn", kwargs, info, [cin, int(hw[0]), int(hw[1])]), seed_for(seed))


def sequential(info, layers, seed=0):
    """The Sequential node (``layers`` with canonical torch argument names; sizes may be "auto")."""
    info = info or {}
    shape = info.get("input_shape") or None
    return build_model(make_spec("sequential", {"layers": resolve_auto_sizes(layers, shape)}, info, shape),
                       seed_for(seed))
