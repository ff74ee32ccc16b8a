"""Predictor settings from the environment and ``$XPUFLEET_HOME/config.yaml`` (I/O at the edge).

``config.yaml`` keys read here::

    model_dirs:                 # a flat list of ComfyUI-style ``models`` roots ...
      - /data/comfy/models
    model_dirs:                 # ... or folder name -> list of folders
      checkpoints: [/data/ckpt]
      loras: [/data/loras]
    predictor:
      gamma: {amd: 2.0}         # platform factors beyond docs/predictor.md's NVIDIA 4.0 / Intel 1.0
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..constants import CONFIG_FILENAME, ENV_MODEL_DIRS, ENV_PREDICTOR_GAMMA, home_dir

_CONFIG_CACHE: dict[str, tuple[tuple[int, int], dict[str, Any]]] = {}


def load_config(path: Path | None = None) -> dict[str, Any]:
    """The parsed config file, ``{}`` when there is none; ValueError naming the file when it is broken.
    Parsed once per change of the file (size and mtime), so every request can ask cheaply."""
    path = path or home_dir() / CONFIG_FILENAME
    try:
        st = os.stat(path)
    except OSError:
        return {}
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _CONFIG_CACHE.get(str(path))
    if hit is not None and hit[0] == stamp:
        return hit[1]
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return {}
    import yaml  # lazy: only when a config file exists

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML: {exc}") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    _CONFIG_CACHE[str(path)] = (stamp, data)
    return data


def parse_gamma_env(text: str) -> dict[str, float]:
    """Parse ``"amd=2.0,apple=1.5"``; ValueError naming the bad entry."""
    out: dict[str, float] = {}
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, value = part.partition("=")
        try:
            g = float(value)
        except ValueError:
            g = float("nan")
        if not sep or not name.strip() or not (g > 0 and g < float("inf")):
            raise ValueError(f"{ENV_PREDICTOR_GAMMA}: bad entry {part!r}; write platform=number, e.g. amd=2.0")
        out[name.strip().lower()] = g
    return out


def gamma_overrides(config: dict[str, Any] | None = None) -> dict[str, float]:
    """Configured platform factors: config file ``predictor.gamma`` then the env var (env wins)."""
    config = load_config() if config is None else config
    out: dict[str, float] = {}
    table = (config.get("predictor") or {}).get("gamma") if isinstance(config.get("predictor"), dict) else None
    if table is not None:
        if not isinstance(table, dict):
            raise ValueError("config.yaml: predictor.gamma must map platform names to numbers")
        for name, value in table.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(f"config.yaml: predictor.gamma.{name} must be a number > 0, got {value!r}")
            out[str(name).lower()] = float(value)
    env = os.environ.get(ENV_PREDICTOR_GAMMA)
    if env:
        out.update(parse_gamma_env(env))
    return out


def model_dirs_from_environment(config: dict[str, Any] | None = None) -> tuple[list[Path], dict[str, list[Path]]]:
    """Configured model folders: (``models`` roots, folder name -> folders).

    ``XPUFLEET_MODEL_DIRS`` is an ``os.pathsep``-separated list of roots; an entry written
    ``folder=path`` (e.g. ``loras=/data/loras``) names one folder directly. The config file's
    ``model_dirs`` adds to it (a flat list of roots or a mapping folder -> list of paths).
    """
    config = load_config() if config is None else config
    roots: list[Path] = []
    named: dict[str, list[Path]] = {}
    for entry in (os.environ.get(ENV_MODEL_DIRS) or "").split(os.pathsep):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, rest = entry.partition("=")
        if sep and name and "/" not in name and "\\" not in name:
            named.setdefault(name.strip(), []).append(Path(os.path.expanduser(rest.strip())))
        else:
            roots.append(Path(os.path.expanduser(entry)))
    md = config.get("model_dirs")
    if md is None:
        pass
    elif isinstance(md, (list, tuple)):
        roots += [Path(os.path.expanduser(str(p))) for p in md]
    elif isinstance(md, dict):
        for name, paths in md.items():
            if isinstance(paths, str):
                paths = [paths]
            if not isinstance(paths, (list, tuple)):
                raise ValueError(f"config.yaml: model_dirs.{name} must be a path or a list of paths")
            named.setdefault(str(name), []).extend(Path(os.path.expanduser(str(p))) for p in paths)
    else:
        raise ValueError("config.yaml: model_dirs must be a list of folders or a mapping folder -> paths")
    return roots, named
