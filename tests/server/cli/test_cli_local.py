"""`xpufleet run GRAPH.json --local`: in-process runs with no sidecar, as a user runs them."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.e2e


def xpufleet(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XPUFLEET_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "xpufleet.server", *args],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240,
    )


def test_mlp_example_trains_and_prints_a_summary(tmp_path):
    out = xpufleet(tmp_path, "run", str(REPO / "samples/mlp_digits.json"), "--local", "--seed", "3",
                   "--output-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "run succeeded" in out.stdout
    acc = float(re.search(r"val_accuracy\s+([0-9.]+)", out.stdout).group(1))
    assert acc >= 0.90
    assert "XPUTrainingLoop" in out.stderr  # the live view names the nodes as they start
    saved = tmp_path / "home" / "outputs" / "models" / "mlp_digits.safetensors"
    assert saved.is_file() and f"saved model: {saved}" in out.stdout
    assert f"run files: {tmp_path / 'run'}" in out.stdout
    # the saved model, reloaded by the predict example: the Predict node's output is printed too
    out = xpufleet(tmp_path, "run", str(REPO / "samples/predict_saved.json"), "--local")
    assert out.returncode == 0, out.stderr
    assert re.search(r"node 4 \(XPUPredict\): 359 predictions \(classes\)", out.stdout)
    assert f"accuracy vs labels {acc:.4f}" in out.stdout
    assert not (tmp_path / "runs").exists()  # nothing written: no empty run folder left behind


def test_validation_errors_exit_2_and_name_node_and_input(tmp_path):
    graph = json.loads((REPO / "samples/mlp_digits.json").read_text())
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
    graph = json.loads((REPO / "samples/mlp_digits.json").read_text())
    graph["1"]["inputs"].update({"name": "csv", "path": "missing.csv"})
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
    out = xpufleet(tmp_path, "run", str(REPO / "samples/mlp_digits.json"), "--local", "--device", "xpu:3",
                   "--output-dir", str(tmp_path / "run"))
    assert out.returncode == 0, out.stderr
    assert "warning (device_fallback): --device xpu:3: this machine offers" in out.stderr


def test_ctrl_c_stops_after_the_batch_with_an_interrupt_checkpoint(tmp_path):
    import signal
    import threading

    graph = json.loads((REPO / "samples/mlp_digits.json").read_text())
    graph["8"]["inputs"]["epochs"] = 100_000  # cannot finish before the Ctrl-C
    long_run = tmp_path / "long.json"
    long_run.write_text(json.dumps(graph))
    env = {**os.environ, "XPUFLEET_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "xpufleet.server", "run", str(long_run), "--local", "--output-dir",
         str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    watchdog = threading.Timer(180, proc.kill)  # bounds the line reads below
    watchdog.start()
    try:
        seen = []
        for line in proc.stderr:  # the live view names each node as it starts
            seen.append(line)
            if "XPUTrainingLoop [" in line:  # a progress line: training has begun
                proc.send_signal(signal.SIGINT)
                break
        rest_err = proc.stderr.read()
        out = proc.stdout.read()
        code = proc.wait(timeout=120)
    finally:
        watchdog.cancel()
    assert code == 1, "".join(seen) + rest_err + out
    assert "stopping after the current batch" in rest_err
    assert "run cancelled" in out and "Traceback" not in rest_err
    assert (tmp_path / "run" / "checkpoints" / "interrupt.pt").is_file()
    assert f"run files: {tmp_path / 'run'}" in out



def test_output_into_a_closed_pipe_is_quiet(tmp_path):
    # `xpufleet ... | head`: the reader goes away; the command must not print a traceback.
    env = {**os.environ, "XPUFLEET_HOME": str(tmp_path / "home")}
    cmd = [sys.executable, "-m", "xpufleet.server", "predict", str(REPO / "samples/mlp_digits.json"), "--json"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env) as proc:
        proc.stdout.close()  # nobody reads: the first write fails with EPIPE
        err = proc.stderr.read().decode()
        proc.wait(timeout=60)
    assert "Traceback" not in err and "BrokenPipeError" not in err
