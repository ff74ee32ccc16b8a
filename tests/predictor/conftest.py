"""Fixtures for the predictor tests: ComfyUI's real workflow templates and sparse model folders."""

from __future__ import annotations

import copy
import json
from importlib import resources
from pathlib import Path

import pytest

GiB = 1024**3


def templates_dir() -> Path:
    """The templates shipped by the comfyui-workflow-templates-json package."""
    import comfyui_workflow_templates_json as pkg  # a declared test dependency: missing fails, never skips

    return Path(resources.files(pkg) / "templates")


def workflow_files() -> list[Path]:
    """Every workflow template (index files and search options left out)."""
    return sorted(p for p in templates_dir().glob("*.json")
                  if not p.name.startswith("index") and p.name != "fuse_options.json")


_CACHE: dict[str, dict] = {}


def load_template(name: str) -> dict:
    """A fresh copy of one template (tests may edit it)."""
    if name not in _CACHE:
        _CACHE[name] = json.loads((templates_dir() / name).read_text(encoding="utf-8"))
    return copy.deepcopy(_CACHE[name])


def make_sparse(path: Path, size: int) -> Path:
    """A sparse file of exactly ``size`` bytes (no disk blocks for the holes)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


@pytest.fixture
def models_root(tmp_path) -> Path:
    """An empty ComfyUI-style ``models`` root."""
    root = tmp_path / "models"
    root.mkdir()
    return root


@pytest.fixture
def template():
    """``template(name)`` -> a fresh copy of one real ComfyUI workflow template."""
    return load_template


@pytest.fixture
def sparse():
    """``sparse(path, size)`` -> a sparse file of that size."""
    return make_sparse


@pytest.fixture
def all_workflows():
    """Paths of every real workflow template."""
    return workflow_files()
