"""Where nodes write files (checkpoints, TensorBoard, saved models) and how they write them.

- Inside a run: the run directory (``runtime.run_dir()``).
- Saved models: an outputs folder shared between runs, so one graph can load what another saved:
  ComfyUI's output directory (``output/xpufleet``) when hosted, else ``$XPUFLEET_HOME/outputs``.
  Hosted, ModelLoader also looks in ComfyUI's model folder ``models/xpufleet``.
- A path a graph gives for a file it writes (ModelSaver's filename, TrainingLoop's checkpoint_dir)
  stays inside its folder: :func:`resolve_inside` refuses absolute paths, ``..`` and symbolic links
  that lead out, on the sidecar and on workers alike (the same node code runs everywhere).
- Files are written atomically (common/atomic.py: a temp file in the same folder, fsync, rename): a reader never
  sees half a checkpoint, and a crash leaves the previous file intact.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..constants import MAX_PATH_CHARS, MAX_PATH_PART_BYTES, OUTPUTS_DIRNAME, PLUGIN_NAME, home_dir
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


class OutsideFolderError(ValueError):
    """A path a node would write to that is not inside the folder its files must stay in."""


_SEPARATORS = re.compile(r"[\\/]+")


def path_input_check(name: str, value: Any, advice: str, *, empty_ok: bool = False) -> bool | str:
    """A ``VALIDATE_INPUTS`` answer for a path input that must stay inside its folder: True, or the refusal
    (``name``, what is wrong, then ``advice``). None passes: a linked input is known only at run time, where
    the node checks it again; ``""`` passes when ``empty_ok``."""
    if value is None or (empty_ok and value == ""):
        return True
    if not isinstance(value, str):
        return f"{name} must be a string"
    problem = relative_path_problem(value)
    return True if problem is None else f"{name} {problem}; {advice}"


def relative_path_problem(path: str) -> str | None:
    """Why ``path`` cannot name a file inside a folder, or None when it can. Lexical only (no disk):
    empty, NUL, too long, not Unicode text, absolute (``/``, ``~``, a drive or UNC path), ``..``, or a
    name longer than a file system takes. Both ``/`` and ``\\`` separate, on every platform."""
    text = str(path).strip()
    if not text:
        return "is empty"
    if "\x00" in text:
        return "holds a NUL character"
    if len(text) > MAX_PATH_CHARS:
        return f"has {len(text)} characters; a path has at most {MAX_PATH_CHARS}"
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return "is not valid Unicode text"
    if text.startswith("~") or PurePosixPath(text).is_absolute() or PureWindowsPath(text).drive \
            or text.startswith("\\"):
        return "is absolute"
    parts = _SEPARATORS.split(text)
    if ".." in parts:
        return "climbs out of its folder with '..'"
    longest = max(len(part.encode("utf-8")) for part in parts)
    if longest > MAX_PATH_PART_BYTES:
        return f"has a name of {longest} bytes; a file or folder name has at most {MAX_PATH_PART_BYTES}"
    return None


def resolve_inside(root: Path, path: str, what: str, where: str) -> Path:
    """``root / path`` for a file a node writes, refusing (:class:`OutsideFolderError`) any path that
    is not a relative path inside ``root`` (see :func:`relative_path_problem`) or that a symlink
    leads out of it. ``what`` names the input (``ModelSaver: filename``), ``where`` the folder in
    words (never its absolute path: the text reaches whoever wrote the graph)."""
    text = str(path).strip()
    problem = relative_path_problem(text)
    shown = text if len(text) <= 80 else text[:80] + "..."
    hint = f"files go inside {where}: give a relative path like 'models/mlp.safetensors' (no '..', not absolute)"
    if problem is not None:
        raise OutsideFolderError(f"{what} {shown!r} {problem}; {hint}")
    target = Path(root) / text
    real_root = os.path.realpath(root)
    real = os.path.realpath(target)
    if real == real_root:
        raise OutsideFolderError(f"{what} {shown!r} names the folder itself, not a file; {hint}")
    if os.path.commonpath([real_root, real]) != real_root:
        raise OutsideFolderError(f"{what} {shown!r} leads outside {where} through a symbolic link; {hint}")
    return target


OUTPUTS_WORDS = "the outputs folder (ComfyUI's output/xpufleet, else $XPUFLEET_HOME/outputs)"
RUN_DIR_WORDS = "this run's directory"


def resolve_output_path(path: str, location: str = "outputs", what: str = "the file path") -> Path:
    """Where a save path goes: inside the outputs folder or the run directory, never outside
    (:class:`OutsideFolderError`)."""
    if location == "run_dir":
        rd = runtime.run_dir()
        if rd is None:
            raise ValueError(f"location 'run_dir' needs a queued run (this one has no run directory); "
                             f"use location 'outputs' for {str(path)[:80]!r}")
        return resolve_inside(Path(rd), path, what, RUN_DIR_WORDS)
    if location != "outputs":
        raise ValueError(f"unknown location {location!r}: use 'outputs' or 'run_dir'")
    return resolve_inside(outputs_dir(), path, what, OUTPUTS_WORDS)


def work_folder(path: str, what: str) -> Path:
    """A folder a node writes into (TrainingLoop's ``checkpoint_dir``): inside this run's directory
    in a queued run, inside the outputs folder otherwise (ComfyUI's canvas, plain Python)."""
    rd = runtime.run_dir()
    if rd is not None:
        return resolve_inside(Path(rd), path, what, RUN_DIR_WORDS)
    return resolve_inside(outputs_dir(), path, what, OUTPUTS_WORDS)


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


