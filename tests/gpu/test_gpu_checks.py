"""The eight GPU checks (docs/gpu-check.md), one test each, marked ``gpu``: each asserts that its check
passed against its goal on this machine's CUDA GPU.

Under ``make gpu-check`` bench/gpu_check.py has just run every check (``XPUFLEET_GPU_REPORT`` names its
report), so a test reads its check's outcome from that report instead of spending the card's minutes twice;
run alone (``pytest -m gpu``), a test runs its check itself, in a child process like bench/gpu_check.py
does. Without a CUDA GPU every test skips: ``no CUDA GPU``.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import gpu_check
import gpu_report as R
import pytest

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

REPORT_ENV = "XPUFLEET_GPU_REPORT"


@functools.lru_cache(maxsize=1)
def gpu() -> dict:
    return gpu_check.gpu_info()


def outcome(name: str, work: Path) -> R.Outcome:
    path = os.environ.get(REPORT_ENV)
    if path and Path(path).exists():
        report = json.loads(Path(path).read_text())
        found = R.outcome_of(report, name) if report.get("mode") == "gpu" else None
        if found is not None and found.status != "not_run":
            return found
    check = R.check_named(name)
    return gpu_check.run_check(check, "cuda", check.timeout_s, work)


@pytest.mark.parametrize("name", R.CHECK_NAMES)
def test_gpu_check(name, tmp_path):
    info = gpu()
    if not info["available"]:
        pytest.skip(f"no CUDA GPU ({info.get('reason')})")
    o = outcome(name, tmp_path)
    assert o.device == "cuda" and o.status == "pass", R.format_line(o)
