"""Where a workflow's model names lead (docs/predictor.md): a name is checked (relative, no ``..``), then resolved
to a file inside a model folder, through ComfyUI's ``folder_paths`` when hosted, else through
``XPUFLEET_MODEL_DIRS`` / ``config.yaml``. A file that is a link leading outside its model folder is
refused and not read. Nothing outside the model folders is ever opened or stat'ed.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Sub-folder names under a ``models`` root, as ComfyUI's folder_paths lays them out (legacy names last).
FOLDER_SUBDIRS: dict[str, tuple[str, ...]] = {
    "diffusion_models": ("diffusion_models", "unet"),
    "text_encoders": ("text_encoders", "clip"),
    "unet_gguf": ("diffusion_models", "unet"),
    "clip_gguf": ("text_encoders", "clip"),
    "controlnet": ("controlnet", "t2i_adapter"),
}
# Legacy folder_paths names a hosted ComfyUI may still register.
FOLDER_LEGACY = {"diffusion_models": ("unet",), "text_encoders": ("clip",)}


class UnsafeModelName(ValueError):
    """A model name in the workflow would resolve outside the model folders."""


def check_model_name(name: str) -> str:
    """Normalise a workflow's model name to a relative POSIX path; UnsafeModelName when it is
    absolute, has a drive, climbs with ``..`` or contains a NUL byte."""
    if "\x00" in name:
        raise UnsafeModelName(f"model name {name!r} contains a NUL byte")
    norm = name.replace("\\", "/")
    if norm.startswith("/") or (len(norm) >= 2 and norm[1] == ":") or norm.startswith("~"):
        raise UnsafeModelName(
            f"model name {name!r} is an absolute path; name the file relative to its model folder"
        )
    parts = [p for p in norm.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts):
        raise UnsafeModelName(f"model name {name!r} climbs out of its model folder with '..'")
    if not parts:
        raise UnsafeModelName(f"model name {name!r} names no file")
    return "/".join(parts)


# --------------------------------------------------------------------------------------------------
# Resolution of (folder, name) to a file inside a model folder
# --------------------------------------------------------------------------------------------------


@dataclass
class Resolution:
    """Where a name led: ``found`` (path, size), ``missing``, or ``refused`` (reason)."""

    status: str
    path: str | None = None
    size_bytes: int = 0
    folder: str | None = None
    reason: str | None = None


class ModelResolver:
    """Finds model files in a set of base folders per ComfyUI folder name; subclasses say which."""

    source = "none"

    def __init__(self) -> None:
        self._real: dict[str, str] = {}

    def bases(self, folder: str) -> list[str]:
        """Base directories for one ComfyUI folder name (may not exist)."""
        raise NotImplementedError

    def known_folders(self) -> list[str]:
        """Folder names this resolver can search (for loaders it does not know)."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """JSON-ready description for the explanation."""
        return {"source": self.source}

    def _realbase(self, base: str) -> str:
        real = self._real.get(base)
        if real is None:
            real = self._real[base] = os.path.realpath(base)
        return real

    def resolve(self, folders: Iterable[str], name: str) -> Resolution:
        """Look ``name`` (already checked by ``check_model_name``) up in each folder's bases, in order."""
        refused: Resolution | None = None
        for folder in folders:
            for base in self.bases(folder):
                real_base = self._realbase(base)
                candidate = os.path.join(real_base, *name.split("/"))
                try:
                    st = os.lstat(candidate)
                except OSError:
                    continue
                real = os.path.realpath(candidate)
                if real != candidate:
                    # a link somewhere on the way: accept it only if it stays inside the folder
                    if os.path.commonpath([real, real_base]) != real_base:
                        refused = refused or Resolution(
                            "refused",
                            folder=folder,
                            reason=f"{name!r} in {base} is a link leading outside the model folder; not read",
                        )
                        continue
                    try:
                        st = os.stat(real)
                    except OSError:
                        continue
                if not stat.S_ISREG(st.st_mode):
                    continue
                return Resolution("found", path=real, size_bytes=int(st.st_size), folder=folder)
        if refused is not None:
            return refused
        return Resolution("missing", reason=f"not found in {', '.join(folders)}")


class DirsResolver(ModelResolver):
    """Model folders from configuration: ``models`` roots (sub-folders by ComfyUI folder name)
    and/or folders named directly."""

    source = "config"

    def __init__(self, roots: Iterable[Path | str] = (), named: Mapping[str, Iterable[Path | str]] | None = None):
        super().__init__()
        self.roots = [str(r) for r in roots]
        self.named = {k: [str(p) for p in v] for k, v in (named or {}).items()}

    def bases(self, folder: str) -> list[str]:
        out = list(self.named.get(folder, []))
        for alias in FOLDER_LEGACY.get(folder, ()):
            out += self.named.get(alias, [])
        for root in self.roots:
            for sub in FOLDER_SUBDIRS.get(folder, (folder,)):
                out.append(os.path.join(root, sub))
        return out

    def known_folders(self) -> list[str]:
        names = set(self.named)
        for root in self.roots:
            try:
                with os.scandir(root) as it:
                    names.update(e.name for e in it if e.is_dir())
            except OSError:
                continue
        return sorted(names)

    def describe(self) -> dict[str, Any]:
        return {"source": self.source, "roots": self.roots, "folders": self.named}


class FolderPathsResolver(ModelResolver):
    """ComfyUI's own model folders (``folder_paths``), including extra_model_paths.yaml entries."""

    source = "comfyui"

    def __init__(self, folder_paths: Any):
        super().__init__()
        self.fp = folder_paths
        self._bases: dict[str, list[str]] = {}

    def bases(self, folder: str) -> list[str]:
        cached = self._bases.get(folder)
        if cached is not None:
            return cached
        out: list[str] = []
        for name in (folder, *FOLDER_LEGACY.get(folder, ())):
            try:
                out += [p for p in self.fp.get_folder_paths(name) if p not in out]
            except Exception:  # real ComfyUI raises KeyError for a folder it does not register
                continue
        if not out and getattr(self.fp, "models_dir", ""):
            out.append(os.path.join(self.fp.models_dir, folder))
        self._bases[folder] = out
        return out

    def known_folders(self) -> list[str]:
        return sorted(getattr(self.fp, "folder_names_and_paths", {}) or {})


def default_resolver() -> ModelResolver:
    """ComfyUI's folders when running inside ComfyUI (``folder_paths`` already imported), else the
    configured ones (``XPUFLEET_MODEL_DIRS``, ``config.yaml``)."""
    fp = sys.modules.get("folder_paths")
    if fp is not None and hasattr(fp, "get_folder_paths"):
        return FolderPathsResolver(fp)
    from .config import model_dirs_from_environment

    roots, named = model_dirs_from_environment()
    return DirsResolver(roots, named)
