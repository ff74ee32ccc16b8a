"""Where nodes write files (checkpoints, TensorBoard, saved models) and how they write them.

- Inside a run: the run directory (``runtime.run_dir()``).
- Saved models: an outputs folder shared between runs, so one graph can load what another saved:
  ComfyUI's output directory (``output/xpufleet``) when hosted, else ``$XPUFLEET_HOME/outputs``.
  Hosted, ModelLoader also looks in ComfyUI's model folder ``models/xpufleet``.
- Files are written atomically (temp file in the same folder, fsync, ``os.replace``): a reader never
  sees half a checkpoint, and a crash leaves the previous file intact.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from ..constants import OUTPUTS_DIRNAME, PLUGIN_NAME, home_dir
from . import runtime


def _comfy_folder_paths() -> Any:
    """ComfyUI's ``folder_paths`` module when ComfyUI hosts the nodes, else None."""
    try:
        import folder_paths  # type: ignore[import-not-found]  # ComfyUI, when hosted
    except Exception:  # not hosted
        return None
    return folder_paths


def outputs_dir() -> Path:
    """The folder relative ModelSaver/ModelLoader paths resolve against (not created here)."""
    fp = _comfy_folder_paths()
    get_out = getattr(fp, "get_output_directory", None)
    if get_out is not None:
        with contextlib.suppress(Exception):
            return Path(get_out()) / PLUGIN_NAME
    return home_dir() / OUTPUTS_DIRNAME


def model_dirs() -> list[Path]:
    """ComfyUI's model folders for this plugin (``models/xpufleet`` plus any ``xpufleet:`` entry of
    extra_model_paths.yaml) when hosted; nothing otherwise. Registers the folder type on first use."""
    fp = _comfy_folder_paths()
    if fp is None or not hasattr(fp, "get_folder_paths"):
        return []
    try:
        known = getattr(fp, "folder_names_and_paths", {})
        if PLUGIN_NAME not in known and hasattr(fp, "add_model_folder_path") and getattr(fp, "models_dir", None):
            fp.add_model_folder_path(PLUGIN_NAME, os.path.join(fp.models_dir, PLUGIN_NAME))
        return [Path(p) for p in fp.get_folder_paths(PLUGIN_NAME)]
    except Exception:
        return []


def work_dir(kind: str) -> Path:
    """A folder for a node's own files (``checkpoints``, ``tensorboard``).

    Inside a run it is ``<run_dir>/<kind>``; outside one (ComfyUI canvas, plain Python) it is a fresh
    timestamped folder under the outputs folder, so two canvas runs never mix their files.
    """
    rd = runtime.run_dir()
    if rd is not None:
        return Path(rd) / kind
    stamp = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-{time.monotonic_ns() % 1_000_000:06d}"
    return outputs_dir() / "runs" / stamp / kind


def resolve_output_path(path: str, location: str = "outputs") -> Path:
    """Where a relative save path goes: the outputs folder or the run directory; absolute stays."""
    p = Path(os.path.expanduser(str(path).strip()))
    if not str(path).strip():
        raise ValueError("the file path is empty: give a file name like 'models/mlp.safetensors'")
    if p.is_absolute():
        return p
    if location == "run_dir":
        rd = runtime.run_dir()
        if rd is None:
            raise ValueError(
                f"location 'run_dir' needs a queued run (this one has no run directory); "
                f"use location 'outputs' or an absolute path for {path!r}"
            )
        return Path(rd) / p
    if location != "outputs":
        raise ValueError(f"unknown location {location!r}: use 'outputs' or 'run_dir'")
    return outputs_dir() / p


def candidate_paths(path: str) -> list[Path]:
    """Where ModelLoader looks for a relative path, in order: outputs folder, ComfyUI's
    ``models/xpufleet`` folder(s) when hosted, run dir, current dir."""
    p = Path(os.path.expanduser(str(path).strip()))
    if p.is_absolute():
        return [p]
    out = [outputs_dir() / p] + [d / p for d in model_dirs()]
    rd = runtime.run_dir()
    if rd is not None:
        out.append(Path(rd) / p)
    out.append(Path.cwd() / p)
    return out


@contextlib.contextmanager
def atomic_path(target: Path) -> Iterator[Path]:
    """Yield a temp path next to ``target``; on success fsync it and rename it over ``target``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, target)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp_path.unlink()
        raise


def write_atomic(target: Path, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` and move the result to ``target`` atomically; return ``target``."""
    with atomic_path(target) as tmp:
        writer(tmp)
    return Path(target)
