"""Data nodes (docs/nodes.md): Dataset and DataLoader.

The Dataset node loads one of scikit-learn's bundled datasets (no download), a synthetic one, a CSV or
a safetensors file, splits it into train/val with a seed, normalises the inputs with train statistics,
and outputs two map-style torch datasets plus an ``info`` dict (task, num_features, num_classes,
input_shape, ...) that model builders use to size themselves. The DataLoader node wraps a dataset in a
real ``torch.utils.data.DataLoader`` (so ddp can later swap in a DistributedSampler).
"""

from __future__ import annotations

import csv
import difflib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import mounts
from . import types as T

# --- pure loading (numpy arrays; no torch) ------------------------------------------------------------


@dataclass
class RawData:
    """Arrays before splitting: ``x`` (N, ...) float, ``y`` (N,) int labels or (N, T) float targets."""

    x: Any
    y: Any
    task: str  # "classification" | "regression"
    input_shape: list[int]
    classes: list[str] | None = None
    is_image: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class DatasetOptions:
    """Everything the Dataset node's widgets say, with the node's defaults."""

    name: str = "digits"
    val_split: float = 0.2
    seed: int = 0
    normalize: str = "standard"
    as_image: bool = False
    n_samples: int = 1000
    n_features: int = 20
    num_classes: int = 2
    image_size: int = 0
    channels: int = 1
    seq_len: int = 0
    noise: float = 0.1
    path: str = ""
    target_column: str = "target"
    x_key: str = "x"
    y_key: str = "y"
    task: str = "auto"


SYNTHETIC_IMAGE_SIZE = 16  # synthetic_images when image_size is 0 (the estimator treats it as a guess)
SYNTHETIC_SEQ_LEN = 32  # synthetic_sequences when seq_len is 0


def _unknown_dataset(name: str) -> ValueError:
    close = difflib.get_close_matches(name, T.DATASET_CHOICES, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown dataset {name!r}{hint}; choose one of: {', '.join(T.DATASET_CHOICES)}")


def _as_classification(y: Any) -> tuple[Any, list[str]]:
    """Map any label values to 0..K-1; return the int64 labels and the class names in order."""
    import numpy as np

    values, inverse = np.unique(np.asarray(y), return_inverse=True)
    return inverse.astype(np.int64), [str(v) for v in values.tolist()]


def _bundled(opts: DatasetOptions) -> RawData:
    import numpy as np
    from sklearn import datasets as skd

    loader = {
        "digits": skd.load_digits,
        "iris": skd.load_iris,
        "wine": skd.load_wine,
        "breast_cancer": skd.load_breast_cancer,
        "diabetes": skd.load_diabetes,
    }[opts.name]
    bunch = loader()
    x = np.asarray(bunch.data, dtype=np.float32)
    if opts.name == "diabetes":
        y = np.asarray(bunch.target, dtype=np.float32).reshape(-1, 1)
        return RawData(x, y, "regression", [x.shape[1]])
    y = np.asarray(bunch.target, dtype=np.int64)
    names = [str(n) for n in getattr(bunch, "target_names", range(int(y.max()) + 1))]
    if opts.name == "digits" and (opts.as_image or opts.image_size):
        return RawData(x.reshape(-1, 1, 8, 8), y, "classification", [1, 8, 8], names, is_image=True)
    if opts.as_image:
        raise ValueError(f"as_image applies to 'digits' and 'synthetic_images' only, not {opts.name!r}")
    return RawData(x, y, "classification", [x.shape[1]], names)


def _positive(name: str, value: int, minimum: int = 1) -> int:
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def _synthetic(opts: DatasetOptions) -> RawData:
    import numpy as np

    n = _positive("n_samples", opts.n_samples, 2)
    rng = np.random.default_rng(opts.seed)
    if opts.name == "synthetic_classification":
        from sklearn.datasets import make_classification

        k = _positive("num_classes", opts.num_classes, 2)
        f = _positive("n_features", opts.n_features, 2)
        informative = max(2, min(f, math.ceil(math.log2(k * 2)) + 2))
        x, y = make_classification(
            n_samples=n, n_features=f, n_informative=informative, n_redundant=0, n_classes=k,
            n_clusters_per_class=1, flip_y=min(max(opts.noise, 0.0), 1.0) * 0.1, random_state=opts.seed,
        )
        return RawData(x.astype(np.float32), y.astype(np.int64), "classification", [f],
                       [str(i) for i in range(k)])
    if opts.name == "synthetic_regression":
        from sklearn.datasets import make_regression

        f = _positive("n_features", opts.n_features)
        x, y = make_regression(n_samples=n, n_features=f, n_informative=max(1, f // 2),
                               noise=max(opts.noise, 0.0) * 10.0, random_state=opts.seed)
        return RawData(x.astype(np.float32), y.astype(np.float32).reshape(-1, 1), "regression", [f])
    if opts.name == "synthetic_images":
        # Each class is a fixed random template; samples are template + noise, so a CNN can learn it.
        k = _positive("num_classes", opts.num_classes, 2)
        c = _positive("channels", opts.channels)
        size = int(opts.image_size) or SYNTHETIC_IMAGE_SIZE
        _positive("image_size", size, 2)
        templates = rng.standard_normal((k, c, size, size)).astype(np.float32)
        y = rng.integers(0, k, size=n).astype(np.int64)
        x = templates[y] + rng.standard_normal((n, c, size, size)).astype(np.float32) * max(opts.noise, 0.0) * 10
        return RawData(x.astype(np.float32), y, "classification", [c, size, size],
                       [str(i) for i in range(k)], is_image=True)
    if opts.name == "synthetic_sequences":
        # Class = which of k frequencies drives the sequence; shape (seq_len, n_features).
        k = _positive("num_classes", opts.num_classes, 2)
        f = _positive("n_features", opts.n_features)
        length = int(opts.seq_len) or SYNTHETIC_SEQ_LEN
        _positive("seq_len", length, 2)
        y = rng.integers(0, k, size=n).astype(np.int64)
        t = np.arange(length, dtype=np.float32)[None, :, None]
        freq = (1.0 + y.astype(np.float32))[:, None, None] * (2 * np.pi / length)
        phase = rng.uniform(0, 2 * np.pi, size=(n, 1, f)).astype(np.float32)
        x = np.sin(freq * t + phase) + rng.standard_normal((n, length, f)).astype(np.float32) * max(opts.noise, 0.0)
        return RawData(x.astype(np.float32), y, "classification", [length, f], [str(i) for i in range(k)])
    raise _unknown_dataset(opts.name)


def _infer_task(values: list[str], requested: str) -> str:
    if requested in ("classification", "regression"):
        return requested
    if requested != "auto":
        raise ValueError(f"task must be one of {', '.join(T.TASK_CHOICES)}, got {requested!r}")
    try:
        nums = [float(v) for v in values]
    except ValueError:
        return "classification"
    integral = all(math.isfinite(v) and v == int(v) for v in nums)
    return "classification" if integral and len(set(nums)) <= 50 else "regression"


def _csv(opts: DatasetOptions) -> RawData:
    import numpy as np

    path = _existing_file(opts.path, "CSV")
    with open(path, newline="", encoding="utf-8-sig") as fh:
        rows = list(csv.reader(fh))
    if not rows:
        raise ValueError(f"CSV file {path} is empty")
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if any(cell.strip() for cell in r)]
    if opts.target_column not in header:
        raise ValueError(
            f"CSV file {path} has no column {opts.target_column!r}; its columns are: {', '.join(header)}. "
            f"Set target_column to one of them."
        )
    if not body:
        raise ValueError(f"CSV file {path} has a header but no data rows")
    t_idx = header.index(opts.target_column)
    feat_idx = [i for i in range(len(header)) if i != t_idx]
    if not feat_idx:
        raise ValueError(f"CSV file {path} has only the target column; it needs at least one feature column")
    x = np.empty((len(body), len(feat_idx)), dtype=np.float32)
    targets: list[str] = []
    for r, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"CSV file {path}, line {r}: {len(row)} cells but the header has {len(header)}")
        for j, i in enumerate(feat_idx):
            cell = row[i].strip()
            try:
                x[r - 2, j] = float(cell)
            except ValueError:
                raise ValueError(
                    f"CSV file {path}, line {r}, column {header[i]!r}: {cell!r} is not a number "
                    f"(feature columns must be numeric; only the target column may hold labels)"
                ) from None
        targets.append(row[t_idx].strip())
    task = _infer_task(targets, opts.task)
    if task == "classification":
        y, classes = _as_classification(targets)
        # Numeric labels sort numerically, not as strings ("10" after "9").
        try:
            order = sorted({float(v) for v in targets})
            classes = [next(t for t in targets if float(t) == v) for v in order]
            lookup = {float(c): i for i, c in enumerate(classes)}
            y = np.asarray([lookup[float(t)] for t in targets], dtype=np.int64)
        except ValueError:
            pass
        return RawData(x, y, task, [x.shape[1]], classes, extra={"columns": [header[i] for i in feat_idx]})
    try:
        y = np.asarray([float(t) for t in targets], dtype=np.float32).reshape(-1, 1)
    except ValueError:
        raise ValueError(f"CSV file {path}: task 'regression' needs a numeric target column "
                         f"{opts.target_column!r}") from None
    return RawData(x, y, task, [x.shape[1]], extra={"columns": [header[i] for i in feat_idx]})


def _existing_file(path: str, what: str) -> Path:
    if not str(path).strip():
        raise ValueError(f"dataset '{what.lower()}' needs a path: set path to the {what} file")
    p = mounts.input_path(path)  # a worker's "label:file" stays inside that mount
    if not p.is_file():
        raise ValueError(f"{what} file not found: {p}")
    return p


def _safetensors(opts: DatasetOptions) -> RawData:
    import numpy as np
    from safetensors.numpy import load_file

    path = _existing_file(opts.path, "safetensors")
    try:
        tensors = load_file(str(path))
    except Exception as exc:
        raise ValueError(f"cannot read safetensors file {path}: {exc}") from None
    for key, role in ((opts.x_key, "x_key"), (opts.y_key, "y_key")):
        if key not in tensors:
            raise ValueError(f"safetensors file {path} has no tensor {key!r} ({role}); "
                             f"its tensors are: {', '.join(sorted(tensors))}")
    x = np.asarray(tensors[opts.x_key]).astype(np.float32)
    y = np.asarray(tensors[opts.y_key])
    if x.ndim < 2 or y.shape[0] != x.shape[0]:
        raise ValueError(f"safetensors file {path}: {opts.x_key!r} must be (N, ...) and {opts.y_key!r} (N, ...) "
                         f"with the same N; got {list(x.shape)} and {list(y.shape)}")
    task = opts.task
    if task == "auto":
        task = "classification" if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_ else "regression"
    if task == "classification":
        if y.ndim != 1:
            raise ValueError(f"safetensors file {path}: classification labels {opts.y_key!r} must be 1-D, "
                             f"got shape {list(y.shape)}")
        labels, classes = _as_classification(y)
        return RawData(x, labels, task, list(x.shape[1:]), classes, is_image=x.ndim == 4)
    y = y.astype(np.float32).reshape(y.shape[0], -1)
    return RawData(x, y, task, list(x.shape[1:]), is_image=x.ndim == 4)


def load_raw(opts: DatasetOptions) -> RawData:
    """Load the whole dataset ``opts.name`` as numpy arrays (no split, no normalisation)."""
    if opts.name in T.BUNDLED_DATASETS:
        return _bundled(opts)
    if opts.name in T.SYNTHETIC_DATASETS:
        return _synthetic(opts)
    if opts.name == "csv":
        return _csv(opts)
    if opts.name == "safetensors":
        return _safetensors(opts)
    raise _unknown_dataset(opts.name)


def split_indices(n: int, val_split: float, seed: int, labels: Any = None) -> tuple[Any, Any]:
    """Train/val index arrays; stratified by ``labels`` when every class has at least two samples."""
    import numpy as np

    if not 0.0 <= float(val_split) < 1.0:
        raise ValueError(f"val_split must be in [0, 1), got {val_split}")
    n_val = int(round(n * float(val_split)))
    if val_split > 0 and n_val == 0:
        n_val = 1
    if n_val >= n:
        raise ValueError(f"val_split {val_split} leaves no training samples out of {n}")
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


def _resize_images(x: Any, size: int) -> Any:
    import torch
    import torch.nn.functional as F

    t = torch.from_numpy(x)
    return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False).numpy()


def build_datasets(opts: DatasetOptions) -> tuple[Any, Any, dict[str, Any]]:
    """Train and val ``XpuTensorDataset`` plus the info dict, from the Dataset node's options."""
    import numpy as np
    import torch

    from .tensordata import XpuTensorDataset

    if opts.normalize not in T.NORMALIZE_CHOICES:
        raise ValueError(f"normalize must be one of {', '.join(T.NORMALIZE_CHOICES)}, got {opts.normalize!r}")
    raw = load_raw(opts)
    x = raw.x
    if raw.is_image and opts.image_size and opts.name == "digits" and int(opts.image_size) != 8:
        x = _resize_images(x, _positive("image_size", opts.image_size, 2))
        raw.input_shape = [1, int(opts.image_size), int(opts.image_size)]
    n = int(x.shape[0])
    train_idx, val_idx = split_indices(n, opts.val_split, opts.seed,
                                       raw.y if raw.task == "classification" else None)
    x_train, x_val = x[train_idx], x[val_idx]
    if opts.normalize != "none":
        # Images: one statistic over all pixels (per-pixel stats would erase the shapes a CNN learns).
        axis = None if raw.is_image else 0
        if opts.normalize == "standard":
            shift = x_train.mean(axis=axis, keepdims=axis is None)
            scale = x_train.std(axis=axis, keepdims=axis is None)
        else:
            shift = x_train.min(axis=axis, keepdims=axis is None)
            scale = x_train.max(axis=axis, keepdims=axis is None) - shift
        scale = np.where(scale > 1e-12, scale, 1.0).astype(np.float32)
        x_train = (x_train - shift) / scale
        x_val = (x_val - shift) / scale
    y_dtype = torch.long if raw.task == "classification" else torch.float32
    info: dict[str, Any] = {
        "name": opts.name,
        "task": raw.task,
        "input_shape": [int(d) for d in raw.input_shape],
        "num_features": int(np.prod(raw.input_shape)),
        "num_classes": len(raw.classes) if raw.task == "classification" and raw.classes else 0,
        "classes": raw.classes,
        "target_shape": [] if raw.task == "classification" else [int(raw.y.shape[1])],
        "is_image": raw.is_image,
        "image_size": int(raw.input_shape[-1]) if raw.is_image else 0,
        "seq_len": int(raw.input_shape[0]) if opts.name == "synthetic_sequences" else 0,
        "n_train": int(len(train_idx)),
        "n_val": int(len(val_idx)),
        "val_split": float(opts.val_split),
        "seed": int(opts.seed),
        "normalize": opts.normalize,
        **raw.extra,
    }
    if info["num_classes"] and raw.task == "classification":
        info["out_features"] = info["num_classes"]
    else:
        info["out_features"] = int(np.prod(info["target_shape"])) if info["target_shape"] else 1

    def make(xs: Any, idx: Any, split: str) -> Any:
        return XpuTensorDataset(
            torch.from_numpy(np.ascontiguousarray(xs, dtype=np.float32)),
            torch.from_numpy(np.ascontiguousarray(raw.y[idx])).to(y_dtype),
            {**info, "split": split},
        )

    return make(x_train, train_idx, "train"), make(x_val, val_idx, "val"), info


# --- nodes ----------------------------------------------------------------------------------------------


class XPUDataset:
    """Dataset node: bundled, synthetic, CSV or safetensors data, split into train and val."""

    DESCRIPTION = (
        "Loads a dataset (scikit-learn's bundled digits/iris/wine/breast_cancer/diabetes need no download; "
        "synthetic ones; CSV or safetensors files), splits it into train/val with a seed and normalises the "
        "inputs with train statistics. 'info' tells model builders the input shape and number of classes."
    )
    CATEGORY = T.CATEGORY_DATA
    FUNCTION = "load"
    RETURN_TYPES = (T.DATASET, T.DATASET, T.DATASET_INFO)
    RETURN_NAMES = ("train", "val", "info")
    OUTPUT_NODE = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "name": (T.DATASET_CHOICES, {"default": "digits", "tooltip": "bundled (no download), synthetic, or a csv / "
                                                                          "safetensors file (set path)"}),
                "val_split": ("FLOAT", {"default": 0.2, "min": 0.0, "max": 0.9, "step": 0.05,
                                        "tooltip": "fraction of samples held out for validation"}),
                "seed": ("INT", {"default": 0, "min": 0, "max": 2**31 - 1,
                                 "tooltip": "seed of the split and of synthetic data"}),
                "normalize": (T.NORMALIZE_CHOICES, {"default": "standard",
                                                    "tooltip": "scale inputs with statistics of the train split"}),
            },
            "optional": {
                "as_image": ("BOOLEAN", {"default": False, "tooltip": "digits as 1x8x8 images (for the CNN)"}),
                "n_samples": ("INT", {"default": 1000, "min": 2, "max": 10_000_000,
                                      "tooltip": "synthetic datasets only"}),
                "n_features": ("INT", {"default": 20, "min": 1, "max": 100_000,
                                       "tooltip": "synthetic datasets: features per sample (per step for sequences)"}),
                "num_classes": ("INT", {"default": 2, "min": 2, "max": 100_000,
                                        "tooltip": "synthetic classification, images and sequences"}),
                "image_size": ("INT", {"default": 0, "min": 0, "max": 4096,
                                       "tooltip": "side of square images; 0 = the dataset's own"}),
                "channels": ("INT", {"default": 1, "min": 1, "max": 64, "tooltip": "synthetic_images: channels per image"}),
                "seq_len": ("INT", {"default": 0, "min": 0, "max": 1_000_000,
                                    "tooltip": "synthetic_sequences length; 0 = 32"}),
                "noise": ("FLOAT", {"default": 0.1, "min": 0.0, "max": 10.0, "step": 0.01,
                                    "tooltip": "synthetic datasets: how noisy the samples are"}),
                "path": ("STRING", {"default": "", "tooltip": "CSV or safetensors file"}),
                "target_column": ("STRING", {"default": "target", "tooltip": "CSV column holding the target"}),
                "x_key": ("STRING", {"default": "x", "tooltip": "safetensors tensor with the inputs"}),
                "y_key": ("STRING", {"default": "y", "tooltip": "safetensors tensor with the targets"}),
                "task": (T.TASK_CHOICES, {"default": "auto",
                                          "tooltip": "csv / safetensors: auto = integer labels are classes"}),
            },
        }

    @classmethod
    def IS_CHANGED(cls, name: str = "", path: str = "", **_: Any) -> Any:
        """ComfyUI re-runs the node when a CSV/safetensors file changes on disk (its mtime)."""
        if name in T.FILE_DATASETS and str(path).strip():
            try:
                return os.path.getmtime(mounts.input_path(path))
            except (OSError, mounts.MountError):
                return float("nan")  # missing: always re-run, so the error shows
        return ""

    def load(self, name: str, val_split: float = 0.2, seed: int = 0, normalize: str = "standard",
             **optional: Any) -> tuple[Any, Any, dict[str, Any]]:
        known = set(DatasetOptions.__dataclass_fields__)
        unknown = sorted(set(optional) - known)
        if unknown:
            raise ValueError(f"Dataset: unknown inputs {', '.join(unknown)}")
        opts = DatasetOptions(name=name, val_split=val_split, seed=seed, normalize=normalize, **optional)
        return build_datasets(opts)


class XPUDataLoader:
    """DataLoader node: batches a dataset with a real torch DataLoader."""

    DESCRIPTION = (
        "Wraps a dataset in a torch DataLoader. batch_size is per device (under ddp each card reads its own "
        "share with this batch size)."
    )
    CATEGORY = T.CATEGORY_DATA
    FUNCTION = "make"
    RETURN_TYPES = (T.DATALOADER,)
    RETURN_NAMES = ("dataloader",)
    OUTPUT_NODE = False

    @classmethod
    def INPUT_TYPES(cls) -> dict[str, Any]:
        return {
            "required": {
                "dataset": (T.DATASET, {"tooltip": "a Dataset node's train or val output"}),
                "batch_size": ("INT", {"default": 32, "min": 1, "max": 65536, "tooltip": "samples per batch (per device)"}),
                "shuffle": ("BOOLEAN", {"default": True, "tooltip": "a new order every epoch (train); off for val"}),
                "num_workers": ("INT", {"default": 0, "min": 0, "max": 64,
                                        "tooltip": "loader worker processes (0 = load in the training process)"}),
                "drop_last": ("BOOLEAN", {"default": False, "tooltip": "skip a last batch smaller than batch_size"}),
            },
            "optional": {
                "pin_memory": ("BOOLEAN", {"default": False,
                                           "tooltip": "page-locked batches for faster copies to a GPU"}),
            },
        }

    def make(self, dataset: Any, batch_size: int, shuffle: bool, num_workers: int = 0, drop_last: bool = False,
             pin_memory: bool = False) -> tuple[Any]:
        from torch.utils.data import DataLoader, IterableDataset

        from .tensordata import collate

        if dataset is None or not (hasattr(dataset, "__getitem__") or isinstance(dataset, IterableDataset)):
            raise ValueError("DataLoader: 'dataset' must be a dataset (connect a Dataset node's train or val output)")
        if int(batch_size) < 1:
            raise ValueError(f"DataLoader: batch_size must be >= 1, got {batch_size}")
        if isinstance(dataset, IterableDataset) and shuffle:
            raise ValueError("DataLoader: an iterable dataset cannot be shuffled; set shuffle to false")
        # RandomSampler refuses an empty dataset (val_split 0 gives one): nothing to shuffle there.
        shuffle = bool(shuffle) and (isinstance(dataset, IterableDataset) or len(dataset) > 0)
        loader = DataLoader(
            dataset,
            batch_size=int(batch_size),
            shuffle=shuffle,
            num_workers=int(num_workers),
            drop_last=bool(drop_last),
            collate_fn=collate,
            pin_memory=bool(pin_memory),
            persistent_workers=False,
        )
        return (loader,)


NODE_CLASS_MAPPINGS: dict[str, type] = {
    T.DATASET_NODE: XPUDataset,
    T.DATALOADER_NODE: XPUDataLoader,
}
NODE_DISPLAY_NAME_MAPPINGS: dict[str, str] = {
    T.DATASET_NODE: "Dataset",
    T.DATALOADER_NODE: "DataLoader",
}
