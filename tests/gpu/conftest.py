"""The GPU checks as tests (marker ``gpu``; docs/gpu-check.md). They run only when selected (``-m gpu``:
``make gpu-check``), so the unit and e2e selections of ``make test`` leave them out (deselected) instead of
listing eight skips; selected on a machine without a CUDA GPU, each skips with the reason ``no CUDA GPU``.
bench/'s modules are importable by name from here (bench/ is a folder of scripts, not a package)."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = str(Path(__file__).resolve().parents[2] / "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)


def gpu_selected(markexpr: str) -> bool:
    """Whether ``-m`` asks for the gpu tests (``gpu``, ``gpu and ...``; not ``not gpu``)."""
    words = markexpr.replace("(", " ").replace(")", " ").split()
    return any(w == "gpu" and (i == 0 or words[i - 1] != "not") for i, w in enumerate(words))


def pytest_collection_modifyitems(config, items):
    if gpu_selected(config.getoption("markexpr") or ""):
        return
    left_out = [item for item in items if item.get_closest_marker("gpu") is not None]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if item.get_closest_marker("gpu") is None]
