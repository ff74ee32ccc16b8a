"""Data nodes (docs/nodes.md): Dataset and DataLoader.

The Dataset node loads one of scikit-learn's bundled datasets (no download), a synthetic one, a CSV or
a safetensors file, splits it into train/val with a seed, normalises the inputs with train statistics,
and outputs two map-style torch datasets plus an ``info`` dict (task, num_features, num_classes,
input_shape, ...) that model builders use to size themselves. The DataLoader node wraps a dataset in a
real ``torch.utils.data.DataLoader`` (so ddp can later swap in a DistributedSampler).
"""

from __future__ import annotations

import difflib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import paths
from . import types as T
from .contract import Node, float_widget, inputs_of, int_widget, option, socket, widget
from .lib import datasets
from .lib.datasets import SYNTHETIC_IMAGE_SIZE, SYNTHETIC_SEQ_LEN, split_indices

__all__ = ["SYNTHETIC_IMAGE_SIZE", "SYNTHETIC_SEQ_LEN", "DatasetOptions", "RawData", "build_datasets", "load_raw",
           "split_indices"]

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
    """Everything the Dataset node's widgets say: each field is its widget (nodes/contract.py's ``option``),
    so the defaults here are the node's."""

    name: str = option(widget(T.DATASET_CHOICES, "digits", "bundled (no download), synthetic, or a csv / "
                                                           "safetensors file (set path)"))
    val_split: float = option(float_widget(0.2, 0.0, 0.9, 0.05, "fraction of samples held out for validation"))
    seed: int = option(int_widget(0, 0, 2**31 - 1, "seed of the split and of synthetic data"))
    normalize: str = option(widget(T.NORMALIZE_CHOICES, "standard",
                                   "scale inputs with statistics of the train split"))
    as_image: bool = option(widget("BOOLEAN", False, "digits as 1x8x8 images (for the CNN)"))
    n_samples: int = option(int_widget(1000, 2, 10_000_000, "synthetic datasets only"))
    n_features: int = option(int_widget(20, 1, 100_000,
                                        "synthetic datasets: features per sample (per step for sequences)"))
    num_classes: int = option(int_widget(2, 2, 100_000, "synthetic classification, images and sequences"))
    image_size: int = option(int_widget(0, 0, 4096, "side of square images; 0 = the dataset's own"))
    channels: int = option(int_widget(1, 1, 64, "synthetic_images: channels per image"))
    seq_len: int = option(int_widget(0, 0, 1_000_000, "synthetic_sequences length; 0 = 32"))
    noise: float = option(float_widget(0.1, 0.0, 10.0, 0.01, "synthetic datasets: how noisy the samples are"))
    path: str = option(widget("STRING", "", "CSV or safetensors file"))
    target_column: str = option(widget("STRING", "target", "CSV column holding the target"))
    x_key: str = option(widget("STRING", "x", "safetensors tensor with the inputs"))
    y_key: str = option(widget("STRING", "y", "safetensors tensor with the targets"))
    task: str = option(widget(T.TASK_CHOICES, "auto", "csv / safetensors: auto = integer labels are classes"))


def _unknown_dataset(name: str) -> ValueError:
    close = difflib.get_close_matches(name, T.DATASET_CHOICES, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return ValueError(f"unknown dataset {name!r}{hint}; choose one of: {', '.join(T.DATASET_CHOICES)}")


def _raw(arrays: tuple[Any, ...], **extra: Any) -> RawData:
    x, y, task, shape, classes, is_image = arrays
    return RawData(x, y, task, shape, classes, is_image=is_image, extra=extra)


def _csv(opts: DatasetOptions) -> RawData:
    path = _existing_file(opts.path, "csv")
    columns, x, targets = datasets.read_csv_table(path, opts.target_column)
    if opts.task not in T.TASK_CHOICES:
        raise ValueError(f"task must be one of {', '.join(T.TASK_CHOICES)}, got {opts.task!r}")
    y, task, classes = datasets.csv_targets(path, opts.target_column, targets, opts.task)
    return RawData(x, y, task, [x.shape[1]], classes, extra={"columns": columns})


def _existing_file(path: str, name: str) -> Path:
    """The file dataset ``name`` reads, inside a folder graphs may read (nodes/paths.py)."""
    kind = "CSV" if name == "csv" else name
    if not str(path).strip():
        raise ValueError(f"dataset '{name}' needs a path: set path to the {kind} file")
    candidates = paths.read_candidates(path, "Dataset: path")
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise ValueError(f"{kind} file not found: {str(path).strip()[:200]!r}; looked in: "
                         f"{', '.join(str(p) for p in candidates)}")
    return found


def load_raw(opts: DatasetOptions) -> RawData:
    """Load the whole dataset ``opts.name`` as numpy arrays (no split, no normalisation)."""
    if opts.name in T.BUNDLED_DATASETS:
        return _raw(datasets.bundled_arrays(opts.name, opts.as_image, opts.image_size))
    if opts.name in T.SYNTHETIC_DATASETS:
        return _raw(datasets.synthetic_arrays(opts.name, opts.seed, opts.n_samples, opts.n_features,
                                              opts.num_classes, opts.image_size, opts.channels, opts.seq_len,
                                              opts.noise))
    if opts.name == "csv":
        return _csv(opts)
    if opts.name == "safetensors":
        path = _existing_file(opts.path, "safetensors")
        return _raw(datasets.safetensors_arrays(path, opts.x_key, opts.y_key, opts.task))
    raise _unknown_dataset(opts.name)


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
        x = datasets.resize_images(x, datasets.at_least("image_size", opts.image_size, 2))
        raw.input_shape = [1, int(opts.image_size), int(opts.image_size)]
    n = int(x.shape[0])
    train_idx, val_idx = split_indices(n, opts.val_split, opts.seed,
                                       raw.y if raw.task == "classification" else None)
    x_train, x_val = x[train_idx], x[val_idx]
    x_train, x_val = datasets.normalise_splits(x_train, x_val, opts.normalize, raw.is_image)
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


class XPUDataset(Node, category=T.CATEGORY_DATA, function="load", display="Dataset",
                 returns={"train": T.DATASET, "val": T.DATASET, "info": T.DATASET_INFO}):
    """Dataset node: bundled, synthetic, CSV or safetensors data, split into train and val."""

    DESCRIPTION = (
        "Loads a dataset (scikit-learn's bundled digits/iris/wine/breast_cancer/diabetes need no download; "
        "synthetic ones; CSV or safetensors files), splits it into train/val with a seed and normalises the "
        "inputs with train statistics. 'info' tells model builders the input shape and number of classes."
    )
    REQUIRED, OPTIONAL = inputs_of(DatasetOptions, required=("name", "val_split", "seed", "normalize"))

    @classmethod
    def IS_CHANGED(cls, name: str = "", path: str = "", **_: Any) -> Any:
        """ComfyUI re-runs the node when a CSV/safetensors file changes on disk (its mtime)."""
        if name in T.FILE_DATASETS and str(path).strip():
            try:
                return os.path.getmtime(paths.readable_file(path, "Dataset: path"))
            except (OSError, ValueError):
                return float("nan")  # missing or refused: always re-run, so the error shows
        return ""

    @classmethod
    def VALIDATE_INPUTS(cls, name: Any = None, path: Any = None) -> bool | str:
        """A CSV or safetensors path outside the folders graphs may read is refused by name before the
        run starts (nodes/paths.py); built-in datasets ignore path."""
        if name is not None and name not in T.FILE_DATASETS:
            return True
        return paths.read_input_check("path", path)

    def load(self, name: str, val_split: float = 0.2, seed: int = 0, normalize: str = "standard",
             **optional: Any) -> tuple[Any, Any, dict[str, Any]]:
        known = set(DatasetOptions.__dataclass_fields__)
        unknown = sorted(set(optional) - known)
        if unknown:
            raise ValueError(f"Dataset: unknown inputs {', '.join(unknown)}")
        opts = DatasetOptions(name=name, val_split=val_split, seed=seed, normalize=normalize, **optional)
        return build_datasets(opts)


class XPUDataLoader(Node, category=T.CATEGORY_DATA, function="make", display="DataLoader",
                    returns={"dataloader": T.DATALOADER}):
    """DataLoader node: batches a dataset with a real torch DataLoader."""

    DESCRIPTION = (
        "Wraps a dataset in a torch DataLoader. batch_size is per device (under ddp each card reads its own "
        "share with this batch size)."
    )
    REQUIRED = {
        "dataset": socket(T.DATASET, "a Dataset node's train or val output"),
        "batch_size": int_widget(32, 1, 65536, "samples per batch (per device)"),
        "shuffle": widget("BOOLEAN", True, "a new order every epoch (train); off for val"),
        "num_workers": int_widget(0, 0, 64, "loader worker processes (0 = load in the training process)"),
        "drop_last": widget("BOOLEAN", False, "skip a last batch smaller than batch_size"),
    }
    OPTIONAL = {"pin_memory": widget("BOOLEAN", False, "page-locked batches for faster copies to a GPU")}

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
