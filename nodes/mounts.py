"""Storage mounts (docs/workers.md): labelled folders a worker declares, named by node file inputs.

An agent started with ``--mount datasets=/srv/data`` gives its runs the label ``datasets``; a node file
input written ``datasets:digits.csv`` then reads ``/srv/data/digits.csv`` on that worker, wherever the
graph was built. A reference resolves inside its folder only: an absolute part, a ``..`` component or a
symbolic link that leads out of the folder is refused before anything is opened.

The run process learns its worker's mounts from ``XPUFLEET_MOUNTS`` (JSON ``{"label": "/abs/folder"}``,
set by the agent); the sidecar reads the labels a graph needs with :func:`labels_in_graph` to route the
run to a worker that has them. Pure except :func:`resolve` (which looks at the file system) and
:func:`mounts_from_env`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..constants import ENV_MOUNTS
from . import types as T

# At least two characters, so a Windows drive letter (``C:\data``) is never taken for a label.
LABEL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{1,31}$")
MAX_MOUNTS = 32

# The node inputs that name a file to read (one place: the sidecar's routing and the nodes use it).
FILE_INPUTS: dict[str, tuple[str, ...]] = {
    T.DATASET_NODE: ("path",),
    T.MODEL_LOADER_NODE: ("path",),
    T.TRAINING_LOOP_NODE: ("resume_from",),
}


class MountError(ValueError):
    """A mount reference or declaration that cannot be used (the text says what to fix)."""


def split_ref(value: Any) -> tuple[str, str] | None:
    """``"datasets:digits.csv"`` -> ``("datasets", "digits.csv")``; None for a value that is not a
    mount reference (a plain path, a URL-like ``scheme://``, a drive letter)."""
    if not isinstance(value, str):
        return None
    label, sep, rest = value.strip().partition(":")
    if not sep or not LABEL_RE.match(label) or rest.startswith("//"):
        return None
    return label, rest


def parse_mount_spec(text: str) -> tuple[str, Path]:
    """``"datasets=/srv/data"`` -> ``("datasets", Path("/srv/data"))`` (the folder must exist)."""
    label, sep, folder = str(text).partition("=")
    label = label.strip()
    if not sep or not folder.strip():
        raise MountError(f"invalid --mount {text!r}: write LABEL=FOLDER, e.g. datasets=/srv/data")
    if not LABEL_RE.match(label):
        raise MountError(f"invalid mount label {label!r}: 2-32 letters, digits, '_' or '-', starting with a letter")
    path = Path(os.path.expanduser(folder.strip()))
    if not path.is_absolute():
        path = Path.cwd() / path
    if not path.is_dir():
        raise MountError(f"--mount {label}={folder.strip()}: {path} is not a folder")
    return label, Path(os.path.realpath(path))


def parse_mounts(specs: list[str] | None) -> dict[str, Path]:
    """Every ``--mount`` of an agent (a label given twice is an error)."""
    out: dict[str, Path] = {}
    for spec in specs or []:
        label, path = parse_mount_spec(spec)
        if label in out:
            raise MountError(f"mount label {label!r} is given twice")
        out[label] = path
    if len(out) > MAX_MOUNTS:
        raise MountError(f"{len(out)} mounts; at most {MAX_MOUNTS}")
    return out


def mounts_from_env(env: Mapping[str, str] | None = None) -> dict[str, Path]:
    """The mounts of the worker this run executes on (none outside a worker run)."""
    raw = (os.environ if env is None else env).get(ENV_MOUNTS, "").strip()
    if not raw:
        return {}
    try:
        data = json.loads(raw)
    except ValueError:
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): Path(str(v)) for k, v in data.items() if LABEL_RE.match(str(k))}


def resolve(value: str, mounts: Mapping[str, Path] | None = None) -> Path:
    """The file a mount reference names, inside its folder; raise :class:`MountError` otherwise.

    Nothing is opened: the reference is checked as written (no absolute part, no ``..``), then the
    real path (symbolic links followed) must still lie inside the folder's real path.
    """
    ref = split_ref(value)
    if ref is None:
        raise MountError(f"{value!r} is not a mount reference (LABEL:relative/path)")
    label, rel = ref
    mounts = mounts_from_env() if mounts is None else mounts
    root = mounts.get(label)
    if root is None:
        have = ", ".join(sorted(mounts)) or "none"
        raise MountError(f"mount label {label!r} is not declared where this run executes (its mounts: {have}); "
                         f"start the worker's agent with --mount {label}=FOLDER, or target a worker that has it")
    rel = rel.strip()
    if not rel:
        raise MountError(f"{value!r} names no file: write {label}:relative/path")
    parts = re.split(r"[\\/]+", rel)
    if rel.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", rel):
        raise MountError(f"{value!r}: the path after '{label}:' must be relative to the mount's folder")
    if ".." in parts:
        raise MountError(f"{value!r}: '..' is not allowed in a mount reference (it stays inside {label})")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, *[p for p in parts if p not in ("", ".")]))
    if real != real_root and not real.startswith(real_root.rstrip(os.sep) + os.sep):
        raise MountError(f"{value!r} leads out of mount {label!r} (a symbolic link to {real}); "
                         f"only files inside {real_root} can be read through it")
    return Path(real)


def labels_in_graph(graph: Mapping[str, Any]) -> list[str]:
    """The mount labels a graph's file inputs name, sorted (links and other inputs are ignored)."""
    labels: set[str] = set()
    for node in graph.values():
        if not isinstance(node, Mapping):
            continue
        names = FILE_INPUTS.get(str(node.get("class_type")), ())
        inputs = node.get("inputs") if isinstance(node.get("inputs"), Mapping) else {}
        for name in names:
            ref = split_ref(inputs.get(name))
            if ref is not None:
                labels.add(ref[0])
    return sorted(labels)
