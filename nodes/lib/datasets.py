"""The Dataset node's arrays (docs/nodes.md): bundled and synthetic data, CSV and safetensors files, the
seeded train/val split and the normalisation with train statistics. numpy in, numpy out; inlined into
exported scripts (nodes/lib/__init__.py). numpy is imported inside each function: a control-plane host
imports the nodes' constants without it.
"""

from __future__ import annotations

# --- inlined by xpufleet export from here
import csv
import math

SYNTHETIC_IMAGE_SIZE = 16  # synthetic_images when image_size is 0 (the estimator treats it as a guess)
SYNTHETIC_SEQ_LEN = 32  # synthetic_sequences when seq_len is 0


def classes_of(values):
    """Map any label values to 0..K-1; return the int64 labels and the class names in order."""
    import numpy as np

    found, inverse = np.unique(np.asarray(values), return_inverse=True)
    return inverse.astype(np.int64), [str(v) for v in found.tolist()]


def bundled_arrays(name, as_image=False, image_size=0):
    """(x, y, task, input_shape, classes, is_image) of one of scikit-learn's bundled datasets."""
    import numpy as np
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
    if as_image:
        raise ValueError(f"as_image applies to 'digits' and 'synthetic_images' only, not {name!r}")
    return x, y, "classification", [x.shape[1]], names, False


def at_least(name, value, minimum=1):
    """``value`` as an int, or a ValueError naming the input when it is below ``minimum``."""
    if int(value) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def synthetic_arrays(name, seed, n_samples, n_features, num_classes, image_size, channels, seq_len, noise):
    """(x, y, task, input_shape, classes, is_image) of a synthetic dataset, drawn from ``seed``."""
    import numpy as np

    n = at_least("n_samples", n_samples, 2)
    rng = np.random.default_rng(seed)
    if name == "synthetic_classification":
        from sklearn.datasets import make_classification

        k = at_least("num_classes", num_classes, 2)
        f = at_least("n_features", n_features, 2)
        informative = max(2, min(f, math.ceil(math.log2(k * 2)) + 2))
        x, y = make_classification(n_samples=n, n_features=f, n_informative=informative, n_redundant=0,
                                   n_classes=k, n_clusters_per_class=1, flip_y=min(max(noise, 0.0), 1.0) * 0.1,
                                   random_state=seed)
        return x.astype(np.float32), y.astype(np.int64), "classification", [f], [str(i) for i in range(k)], False
    if name == "synthetic_regression":
        from sklearn.datasets import make_regression

        f = at_least("n_features", n_features)
        x, y = make_regression(n_samples=n, n_features=f, n_informative=max(1, f // 2),
                               noise=max(noise, 0.0) * 10.0, random_state=seed)
        return x.astype(np.float32), y.astype(np.float32).reshape(-1, 1), "regression", [f], None, False
    if name == "synthetic_images":
        # Each class is a fixed random template; samples are template + noise, so a CNN can learn it.
        k = at_least("num_classes", num_classes, 2)
        c = at_least("channels", channels)
        size = int(image_size) or SYNTHETIC_IMAGE_SIZE
        at_least("image_size", size, 2)
        templates = rng.standard_normal((k, c, size, size)).astype(np.float32)
        y = rng.integers(0, k, size=n).astype(np.int64)
        x = templates[y] + rng.standard_normal((n, c, size, size)).astype(np.float32) * max(noise, 0.0) * 10
        return x.astype(np.float32), y, "classification", [c, size, size], [str(i) for i in range(k)], True
    if name != "synthetic_sequences":
        raise ValueError(f"unknown synthetic dataset {name!r}")
    # Class = which of k frequencies drives the sequence; shape (seq_len, n_features).
    k = at_least("num_classes", num_classes, 2)
    f = at_least("n_features", n_features)
    length = int(seq_len) or SYNTHETIC_SEQ_LEN
    at_least("seq_len", length, 2)
    y = rng.integers(0, k, size=n).astype(np.int64)
    t = np.arange(length, dtype=np.float32)[None, :, None]
    freq = (1.0 + y.astype(np.float32))[:, None, None] * (2 * np.pi / length)
    phase = rng.uniform(0, 2 * np.pi, size=(n, 1, f)).astype(np.float32)
    x = np.sin(freq * t + phase) + rng.standard_normal((n, length, f)).astype(np.float32) * max(noise, 0.0)
    return x.astype(np.float32), y, "classification", [length, f], [str(i) for i in range(k)], False


def infer_task(values, requested):
    """``requested`` unless it is "auto"; then classification for at most 50 integral values."""
    if requested in ("classification", "regression"):
        return requested
    try:
        nums = [float(v) for v in values]
    except ValueError:
        return "classification"
    integral = all(math.isfinite(v) and v == int(v) for v in nums)
    return "classification" if integral and len(set(nums)) <= 50 else "regression"


def read_csv_table(path, target_column):
    """(feature column names, x float32 (N, F), the target cells as text) of a CSV file with a header.

    An error never quotes the file (a cell, a header name): it says where (line, column number) and
    what was expected, so a file that is not the user's cannot be read out through a message."""
    import numpy as np

    try:
        with open(path, newline="", encoding="utf-8-sig") as fh:
            rows = list(csv.reader(fh))
    except UnicodeDecodeError:
        raise ValueError(f"CSV file {path} is not UTF-8 text") from None
    except csv.Error:
        raise ValueError(f"CSV file {path} cannot be read as CSV (a NUL byte, or a field over the size limit)") from None
    if not rows:
        raise ValueError(f"CSV file {path} is empty")
    header = [h.strip() for h in rows[0]]
    body = [r for r in rows[1:] if any(cell.strip() for cell in r)]
    if target_column not in header:
        raise ValueError(f"CSV file {path} has no column {target_column!r} among the {len(header)} "
                         f"name{'' if len(header) == 1 else 's'} of its first line (the header); set target_column to the header name of the target column")
    if not body:
        raise ValueError(f"CSV file {path} has a header but no data rows")
    t_idx = header.index(target_column)
    feat_idx = [i for i in range(len(header)) if i != t_idx]
    if not feat_idx:
        raise ValueError(f"CSV file {path} has only the target column; it needs at least one feature column")
    x = np.empty((len(body), len(feat_idx)), dtype=np.float32)
    targets = []
    for r, row in enumerate(body, start=2):
        if len(row) != len(header):
            raise ValueError(f"CSV file {path}, line {r}: {len(row)} cells but the header has {len(header)}")
        for j, i in enumerate(feat_idx):
            cell = row[i].strip()
            try:
                x[r - 2, j] = float(cell)
            except ValueError:
                raise ValueError(f"CSV file {path}, line {r}, column {i + 1}: not a number (feature columns must "
                                 f"be numeric; only the target column may hold labels)") from None
        targets.append(row[t_idx].strip())
    return [header[i] for i in feat_idx], x, targets


def csv_targets(path, target_column, targets, task):
    """(y, task, classes) of a CSV file's target cells; numeric class labels sort numerically."""
    import numpy as np

    task = infer_task(targets, task)
    if task == "classification":
        y, classes = classes_of(targets)
        try:  # numeric labels sort numerically, not as strings ("10" after "9")
            order = sorted({float(v) for v in targets})
            classes = [next(t for t in targets if float(t) == v) for v in order]
            lookup = {float(c): i for i, c in enumerate(classes)}
            y = np.asarray([lookup[float(t)] for t in targets], dtype=np.int64)
        except ValueError:
            pass
        return y, task, classes
    try:
        y = np.asarray([float(t) for t in targets], dtype=np.float32).reshape(-1, 1)
    except ValueError:
        raise ValueError(f"CSV file {path}: task 'regression' needs a numeric target column "
                         f"{target_column!r}") from None
    return y, task, None


def safetensors_arrays(path, x_key, y_key, task):
    """(x, y, task, input_shape, classes, is_image) of a safetensors file's tensors ``x_key``, ``y_key``."""
    import numpy as np
    from safetensors.numpy import load_file

    try:
        tensors = load_file(str(path))
    except Exception as exc:  # its text may quote the file: name the kind of failure only
        raise ValueError(f"cannot read safetensors file {path}: not a safetensors file "
                         f"({type(exc).__name__})") from None
    for key, role in ((x_key, "x_key"), (y_key, "y_key")):
        if key not in tensors:
            raise ValueError(f"safetensors file {path} has no tensor {key!r} ({role}) among its {len(tensors)} "
                             f"tensors; set {role} to the name of the tensor to use")
    x = np.asarray(tensors[x_key]).astype(np.float32)
    y = np.asarray(tensors[y_key])
    if x.ndim < 2 or y.shape[0] != x.shape[0]:
        raise ValueError(f"safetensors file {path}: {x_key!r} must be (N, ...) and {y_key!r} (N, ...) "
                         f"with the same N; got {list(x.shape)} and {list(y.shape)}")
    if task == "auto":
        task = "classification" if np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_ else "regression"
    if task == "classification":
        if y.ndim != 1:
            raise ValueError(f"safetensors file {path}: classification labels {y_key!r} must be 1-D, "
                             f"got shape {list(y.shape)}")
        labels, classes = classes_of(y)
        return x, labels, task, list(x.shape[1:]), classes, x.ndim == 4
    return x, y.astype(np.float32).reshape(y.shape[0], -1), task, list(x.shape[1:]), None, x.ndim == 4


def split_indices(n, val_split, seed, labels=None):
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


def resize_images(x, size):
    """(N, C, H, W) images resized to ``size`` x ``size`` (bilinear)."""
    import torch
    import torch.nn.functional as F

    return F.interpolate(torch.from_numpy(x), size=(size, size), mode="bilinear", align_corners=False).numpy()


def normalise_splits(x_train, x_val, normalize, is_image):
    """Both splits scaled with the train split's statistics ("standard" or "minmax"; "none" leaves them)."""
    import numpy as np

    if normalize == "none":
        return x_train, x_val
    # Images: one statistic over all pixels (per-pixel stats would erase the shapes a CNN learns).
    axis = None if is_image else 0
    if normalize == "standard":
        shift = x_train.mean(axis=axis, keepdims=axis is None)
        scale = x_train.std(axis=axis, keepdims=axis is None)
    else:
        shift = x_train.min(axis=axis, keepdims=axis is None)
        scale = x_train.max(axis=axis, keepdims=axis is None) - shift
    scale = np.where(scale > 1e-12, scale, 1.0).astype(np.float32)
    return (x_train - shift) / scale, (x_val - shift) / scale
