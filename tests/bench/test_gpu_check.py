"""bench/gpu_check.py without a GPU: the listing and its report, bad usage, a check past its time, and (e2e)
each check's code path as a dry run on this CPU with simulated cards (``--device cpu``: not a GPU check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gpu_check
import gpu_checks_compute as compute
import gpu_report as R
import pytest

SCRIPT = Path(gpu_check.__file__)


def cli(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU, even on a machine with one
    return subprocess.run([sys.executable, str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_without_a_gpu_it_lists_the_checks_says_nothing_was_checked_and_exits_0(tmp_path):
    report_path = tmp_path / "out" / "report.json"
    proc = cli("--json", str(report_path))
    assert proc.returncode == 0, proc.stderr
    assert "It would run, on a CUDA GPU:" in proc.stdout
    for i, check in enumerate(R.CHECKS, 1):
        assert f"  {i}. {check.name}: {check.title}; goal: {check.goal}" in proc.stdout
    assert f"{R.NO_GPU_TEXT} (torch.cuda.is_available() is False)" in proc.stdout
    report = json.loads(report_path.read_text())
    assert report["mode"] == "no-gpu" and report["nothing_checked"] is True and report["ok"] is True
    assert [c["name"] for c in report["checks"]] == list(R.CHECK_NAMES)
    assert {c["status"] for c in report["checks"]} == {"not_run"} and not any(c["gpu_figure"] for c in report["checks"])


def test_an_unknown_check_is_refused_with_the_names_to_choose_from():
    proc = cli("--only", "cap,nope")
    assert proc.returncode == 2
    assert "unknown check 'nope': choose from training, estimate_peaks, cap" in proc.stderr


def test_a_check_past_its_time_is_reported_as_such_and_the_next_one_still_runs(tmp_path):
    lines: list[str] = []

    class Out:
        def write(self, text: str) -> None:
            lines.append(text)

        def flush(self) -> None:
            pass

    # 50 ms after the heavy imports: no training check ends that soon, however idle the machine
    slow = R.Check("training", "x", "y", 0.05 / gpu_check.DRY_SCALE)
    outcomes = gpu_check.run_all([slow, slow], "cpu", keep=False, out=Out())
    assert [x.status for x in outcomes] == ["timeout", "timeout"]
    assert all("ran past its 0.05 s" in x.detail for x in outcomes), outcomes
    assert sum(line.startswith("[TIMEOUT] training") for line in lines) == 2


@pytest.mark.e2e
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", R.CHECK_NAMES)
def test_each_check_runs_its_code_path_dry_on_this_cpu(name, tmp_path):
    check = R.check_named(name)
    o = gpu_check.run_check(check, "cpu", check.timeout_s * gpu_check.DRY_SCALE, tmp_path / name)
    assert o.status == "dry" and o.device == "cpu" and o.detail == "", R.format_line(o)
    assert o.figure and o.figure_text
    assert R.format_line(o).startswith(f"[DRY]     {name}: {R.DRY_LABEL}: ")


@pytest.mark.e2e
@pytest.mark.timeout(900)
def test_ddp_on_two_cards_goes_through_the_launcher_and_saves_what_it_trained(tmp_path):
    sides = compute._fleet_ddp("cpu", tmp_path, 2)  # a GPU machine with two cards takes this path
    assert sides["card"]["world_size"] == 2 and sides["gloo"]["world_size"] == 2
    assert {sides["card"]["backend"], sides["gloo"]["backend"]} == {"gloo"}  # simulated cards on both sides
    assert R.max_abs_diff(sides["card"]["weights"], sides["gloo"]["weights"]) == 0.0
