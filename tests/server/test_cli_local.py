"""`xpufleet run GRAPH.json --local`: in-process runs with no sidecar, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.e2e


def xpufleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XPUFLEET_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "xpufleet.server.cli", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240,
    )


def test_mlp_example_trains_and_prints_a_summary(tmp_path):
    out = xpufleet(tmp_path, "run", str(REPO / "examples/mlp_digits.json"), "--local", "--seed", "3",
                   "--output-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "run succeeded" in out.stdout
    acc = float(re.search(r"val_accuracy\s+([0-9.]+)", out.stdout).group(1))
    assert acc >= 0.90
    assert "XPUTrainingLoop" in out.stderr  # the live view names the nodes as they start
    assert (tmp_path / "home" / "outputs" / "models" / "mlp_digits.safetensors").is_file()


def test_validation_errors_exit_2_and_name_node_and_input(tmp_path):
    graph = json.loads((REPO / "examples/mlp_digits.json").read_text())
    graph["2"]["inputs"]["batch_size"] = 0
    del graph["8"]["inputs"]["model"]
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(graph))
    out = xpufleet(tmp_path, "run", str(bad), "--local")
    assert out.returncode == 2
    assert "input 'batch_size' of node 2 (XPUDataLoader)" in out.stderr
    assert "'model' of node 8 (XPUTrainingLoop)" in out.stderr
    assert "Traceback" not in out.stderr


def test_node_failure_exits_1_naming_the_node(tmp_path):
    graph = json.loads((REPO / "examples/mlp_digits.json").read_text())
    graph["1"]["inputs"].update({"name": "csv", "path": str(tmp_path / "missing.csv")})
    bad = tmp_path / "missing_csv.json"
    bad.write_text(json.dumps(graph))
    out = xpufleet(tmp_path, "run", str(bad), "--local")
    assert out.returncode == 1
    assert "run failed" in out.stdout and "Node 1 (XPUDataset) failed" in out.stdout


def test_missing_or_broken_file_exits_2(tmp_path):
    out = xpufleet(tmp_path, "run", str(tmp_path / "nope.json"), "--local")
    assert out.returncode == 2 and "does not exist" in out.stderr
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    out = xpufleet(tmp_path, "run", str(broken), "--local")
    assert out.returncode == 2 and "not valid JSON" in out.stderr


def test_missing_device_falls_back_to_cpu_with_a_warning(tmp_path):
    out = xpufleet(tmp_path, "run", str(REPO / "examples/mlp_digits.json"), "--local", "--device", "xpu:3",
                   "--output-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    assert "warning (device_fallback): --device xpu:3: this machine offers" in out.stderr
