"""Where nodes write files (checkpoints, TensorBoard, saved models) and how they write them.

- Inside a run: the run directory (``runtime.run_dir()``).
- Saved models: an outputs folder shared between runs, so one graph can load what another saved:
  ComfyUI's output directory (``output/xpufleet``) when hosted, else ``$XPUFLEET_HOME/outputs``.
  Hosted, ModelLoader also looks in ComfyUI's model folder ``models/xpufleet``.
- A path a graph gives for a file it writes (ModelSaver's filename, TrainingLoop's checkpoint_dir)
  stays inside its folder: :func:`resolve_inside` refuses absolute paths, ``..`` and symbolic links
  that lead out, on the sidecar and on workers alike (the same node code runs everywhere).
- A file a graph READS (Dataset's path, ModelLoader's path, TrainingLoop's resume_from) must lie inside
  a folder this process lets graphs read (:func:`read_roots`): this run's directory, the outputs folder,
  the worker's mounts (``label:path``), the data roots its owner configured (``XPUFLEET_DATA_ROOTS``,
  ``xpufleet agent start --data-root DIR``) and, hosted, ComfyUI's input/output/models folders. The
  real path (symlinks and ``..`` resolved) is checked, allow-list style; anything else is refused by
  name at validation (``VALIDATE_INPUTS``, before the run starts) and again when the node opens it.
- Files are written atomically (common/atomic.py: a temp file in the same folder, fsync, rename): a reader never
  sees half a checkpoint, and a crash leaves the previous file intact.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from ..constants import (
    ENV_DATA_ROOTS,
    MAX_PATH_CHARS,
    MAX_PATH_PART_BYTES,
    OUTPUTS_DIRNAME,
    PLUGIN_NAME,
    home_dir,
)
from . import mounts, runtime

_NOT_HOSTED: list[bool] = []  # set once an import found no ComfyUI (a failed import scans sys.path)


def _comfy_folder_paths() -> Any:
    """ComfyUI's ``folder_paths`` module when ComfyUI hosts the nodes, else None. ComfyUI imports it
    before any custom node, so a failed import is not retried (each check of a path asks)."""
    found = sys.modules.get("folder_paths")
    if found is not None or _NOT_HOSTED:
        return found
    try:
        import folder_paths  # type: ignore[import-not-found]  # ComfyUI, when hosted
    except Exception:  # not hosted
        _NOT_HOSTED.append(True)
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


# --- files a graph reads ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ReadRoot:
    """A folder graphs may read from, and how a message names it."""

    path: Path
    words: str


def data_roots(env: Mapping[str, str] | None = None) -> list[Path]:
    """The data roots this process was given (``XPUFLEET_DATA_ROOTS``, ``os.pathsep``-separated absolute
    folders), as real paths; a relative or empty entry is ignored (the agent refuses it at start)."""
    raw = (os.environ if env is None else env).get(ENV_DATA_ROOTS, "")
    out: list[Path] = []
    for part in raw.split(os.pathsep):
        folder = os.path.expanduser(part.strip())
        if folder and os.path.isabs(folder):
            real = Path(os.path.realpath(folder))
            if real not in out:
                out.append(real)
    return out


class DataRootError(ValueError):
    """A ``--data-root`` that cannot be used (the text says what to fix)."""


def parse_data_roots(specs: list[str] | None) -> list[Path]:
    """Every ``--data-root DIR`` of an agent as real paths: each must be an existing folder."""
    out: list[Path] = []
    for spec in specs or []:
        text = str(spec).strip()
        folder = Path(os.path.expanduser(text)) if text else None
        if folder is None:
            raise DataRootError("--data-root needs a folder, e.g. --data-root /srv/datasets")
        if not folder.is_absolute():
            folder = Path.cwd() / folder
        if not folder.is_dir():
            raise DataRootError(f"data root {text!r} (--data-root or {ENV_DATA_ROOTS}): {folder} is not a folder")
        real = Path(os.path.realpath(folder))
        if real not in out:
            out.append(real)
    return out


def _comfy_dirs() -> list[ReadRoot]:
    """ComfyUI's input, output and models folders when hosted (a canvas run reads what ComfyUI keeps)."""
    fp = _comfy_folder_paths()
    if fp is None:
        return []
    out: list[ReadRoot] = []
    for getter, words in (("get_input_directory", "ComfyUI's input folder"),
                          ("get_output_directory", "ComfyUI's output folder")):
        fn = getattr(fp, getter, None)
        if fn is not None:
            with contextlib.suppress(Exception):
                out.append(ReadRoot(Path(fn()), words))
    models = getattr(fp, "models_dir", None)
    if models:
        out.append(ReadRoot(Path(models), "ComfyUI's models folder"))
    return out


def search_roots() -> list[ReadRoot]:
    """Where a relative path a graph reads is looked up, in order: the outputs folder, ComfyUI's
    ``models/xpufleet`` folder(s) and input folder (hosted), this run's directory, the data roots."""
    roots = [ReadRoot(outputs_dir(), OUTPUTS_WORDS)]
    roots += [ReadRoot(d, "ComfyUI's models/xpufleet folder") for d in model_dirs()]
    roots += [r for r in _comfy_dirs() if r.words == "ComfyUI's input folder"]
    rd = runtime.run_dir()
    if rd is not None:
        roots.append(ReadRoot(Path(rd), RUN_DIR_WORDS))
    roots += [ReadRoot(d, f"data root {d}") for d in data_roots()]
    return roots


def read_roots() -> list[ReadRoot]:
    """Every folder a graph may read from here: the search roots, ComfyUI's folders (hosted) and the
    worker's mounts."""
    roots = search_roots() + _comfy_dirs()
    roots += [ReadRoot(folder, f"mount {label!r}") for label, folder in sorted(mounts.mounts_from_env().items())]
    return roots


def _inside(real: str, root: Path) -> bool:
    real_root = os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def _allowed_words() -> str:
    """Where files may be, in words (the folders this process allows; data roots and mounts by path:
    their owner chose them to be read)."""
    places = [RUN_DIR_WORDS, OUTPUTS_WORDS]
    hosted = [r.words for r in _comfy_dirs()]
    if hosted:
        places.append(", ".join(hosted))
    have = mounts.mounts_from_env()
    if have:
        places.append("the worker's mounts (write LABEL:path, LABEL one of " + ", ".join(sorted(have)) + ")")
    roots = data_roots()
    places.append("the data roots " + ", ".join(str(d) for d in roots) if roots else
                  "a data root (none is configured here: the worker's owner adds one with "
                  "'xpufleet agent start --data-root DIR' or " + ENV_DATA_ROOTS + ")")
    return "files may be read from " + "; ".join(places)


def _shown(text: str) -> str:
    """The path as the graph gave it (it is the user's own input), cut so a message stays short."""
    return repr(text if len(text) <= 240 else text[:240] + "...")


def read_candidates(value: Any, what: str) -> list[Path]:
    """The places a file input ``value`` may name, each inside a folder graphs may read (real paths for
    an absolute path or a mount reference). Raises :class:`OutsideFolderError` naming ``what`` (the node
    and input), the path and where files may be. Nothing is opened; the file need not exist yet."""
    if not isinstance(value, str):
        raise OutsideFolderError(f"{what} must be a string path")
    text = value.strip()
    if not text or "\x00" in text or len(text) > MAX_PATH_CHARS:
        problem = relative_path_problem(text) or "is not a path"
        raise OutsideFolderError(f"{what} {_shown(text)} {problem}")
    if mounts.split_ref(text) is not None:
        try:
            return [mounts.resolve(text)]
        except mounts.MountError as exc:
            raise OutsideFolderError(f"{what}: {exc}") from None
    expanded = os.path.expanduser(text)
    if os.path.isabs(expanded) or PureWindowsPath(text).drive or text.startswith("\\"):
        real = os.path.realpath(expanded)
        if os.path.isabs(expanded) and any(_inside(real, r.path) for r in read_roots()):
            return [Path(real)]
        raise OutsideFolderError(f"{what} {_shown(text)} is outside the folders graphs may read on this machine; "
                                 f"{_allowed_words()}")
    problem = relative_path_problem(text)
    if problem is not None:
        raise OutsideFolderError(f"{what} {_shown(text)} {problem}; {_allowed_words()}")
    out: list[Path] = []
    for root in search_roots():
        target = root.path / text
        real = os.path.realpath(target)
        if os.path.lexists(target) and not _inside(real, root.path):
            raise OutsideFolderError(f"{what} {_shown(text)} leads outside {root.words} through a symbolic link; "
                                     f"{_allowed_words()}")
        out.append(target)
    return out


def readable_file(value: Any, what: str) -> Path:
    """The file a graph's input ``value`` names, inside a folder graphs may read (see
    :func:`read_candidates`); ValueError when it is refused or exists nowhere it may be."""
    candidates = read_candidates(value, what)
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise ValueError(f"{what} {_shown(str(value).strip())} not found; looked in: "
                         f"{', '.join(str(p) for p in candidates)}")
    return found


def read_input_check(name: str, value: Any) -> bool | str:
    """A ``VALIDATE_INPUTS`` answer for an input naming a file to read: True, or the refusal naming the
    input, the path and where files may be. None and ``""`` pass (a linked input is checked at run time;
    an empty one by the node, which says what to set)."""
    if value is None or value == "":
        return True
    try:
        read_candidates(value, name)
    except OutsideFolderError as exc:
        return str(exc)
    return True


def file_mtime(value: Any) -> Any:
    """An ``IS_CHANGED`` key for a file input: its mtime, NaN when it is refused or missing (so the node
    runs, and says why)."""
    try:
        return readable_file(value, "file").stat().st_mtime_ns
    except (OSError, ValueError):
        return float("nan")


def candidate_paths(path: str) -> list[Path]:
    """Where a model file ``path`` may be (ModelLoader, a model unit's program): see
    :func:`read_candidates`; a path outside the folders graphs may read is refused."""
    return read_candidates(path, "model file")
