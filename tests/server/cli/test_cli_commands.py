"""The `xpufleet` command: start/status/stop, run in its modes, runs, cancel, and the exit codes."""

from __future__ import annotations

import json
import shutil
import subprocess

import psutil
import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

pytestmark = pytest.mark.e2e


def test_without_a_sidecar_commands_say_so_with_exit_code_3(tmp_path):
    sc = harness.Sidecar(tmp_path / "home")
    graph = harness.write_graph(tmp_path / "g.json", harness.iris_graph(1))
    proc = sc.cli("status")
    assert proc.returncode == 3 and "not running" in proc.stdout
    proc = sc.cli("run", str(graph))
    assert proc.returncode == 3 and "no sidecar is running" in proc.stderr and "xpufleet start" in proc.stderr
    proc = sc.cli("runs")
    assert proc.returncode == 3
    proc = sc.cli("stop")
    assert proc.returncode == 0 and "not running" in proc.stdout
    # A stale runtime file (a dead pid) is not mistaken for a running server.
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / "runtime.json").write_text(json.dumps(
        {"url": "http://127.0.0.1:9", "token": "t", "pid": 999999999, "port": 9}))
    assert sc.cli("status").returncode == 3
    assert not (tmp_path / "home" / "runtime.json").exists()


def test_start_status_run_modes_cancel_and_stop(tmp_path):
    sc = harness.Sidecar(tmp_path / "home")
    proc = sc.cli("start", "--port", "0")
    assert proc.returncode == 0 and "XPU Fleet sidecar running at http://127.0.0.1:" in proc.stdout
    sc.start()  # already running: says so, same server
    first = sc.info
    proc = sc.cli("start", "--port", "0")
    assert proc.returncode == 0 and "already running" in proc.stdout and str(first["pid"]) in proc.stdout
    try:
        proc = sc.cli("status")
        assert proc.returncode == 0 and first["url"] in proc.stdout and "cpu on this server" in proc.stdout
        status = json.loads(sc.cli("status", "--json", check=True).stdout)
        assert status["pid"] == first["pid"] and status["slots"][0]["limit"] == 2

        good = harness.write_graph(tmp_path / "good.json", harness.iris_graph(1))
        proc = sc.cli("run", str(good), "--name", "waited")  # default: wait quietly for the outcome
        assert proc.returncode == 0, proc.stderr
        assert "run succeeded" in proc.stdout and "queued run" in proc.stderr

        diverging = harness.iris_graph(2)  # sgd at lr 10 on an MSE loss: the loss becomes NaN
        diverging["5"]["inputs"].update({"name": "sgd", "lr": 10.0})
        diverging["6"]["inputs"]["name"] = "mse"
        proc = sc.cli("run", str(harness.write_graph(tmp_path / "nan.json", diverging)), "--follow", "--seed", "1")
        assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
        assert "run succeeded" in proc.stdout
        assert any(line.split()[:2] == ["train_loss", "nan"] for line in proc.stdout.splitlines()), proc.stdout

        failing = harness.iris_graph(1)
        failing["1"]["inputs"].update({"name": "csv", "path": "missing.csv"})
        proc = sc.cli("run", str(harness.write_graph(tmp_path / "fail.json", failing)))
        assert proc.returncode == 1
        assert "run failed" in proc.stdout and "Node 1 (XPUDataset) failed" in proc.stdout
        assert "CSV file not found" in proc.stdout

        proc = sc.cli("run", str(good), "--devices", "cuda:0,cuda:1")
        assert proc.returncode == 2
        assert "this server does not offer cuda:0, cuda:1 (it offers cpu)" in proc.stderr
        unknown = {"1": {"class_type": "NoSuchNode", "inputs": {}}}
        proc = sc.cli("run", str(harness.write_graph(tmp_path / "unknown.json", unknown)))
        # a node class that is not the fleet's own makes it a ComfyUI run: this server has no ComfyUI
        assert proc.returncode == 2 and "this server has no ComfyUI to run workflows" in proc.stderr
        assert proc.stderr.count("this server has no ComfyUI") == 1  # each problem printed once (issue 9)
        proc = sc.cli("run", str(tmp_path / "nope.json"))
        assert proc.returncode == 2 and "does not exist" in proc.stderr
        (tmp_path / "broken.json").write_text("{")
        assert sc.cli("run", str(tmp_path / "broken.json")).returncode == 2
        ui = {"nodes": [{"id": 1, "type": "XPUDataset"}], "links": []}
        proc = sc.cli("run", str(harness.write_graph(tmp_path / "ui.json", ui)))
        assert proc.returncode == 2 and "export it in API format" in proc.stderr
        proc = sc.cli("run", str(good), "--device", "cpu", "--devices", "cpu")
        assert proc.returncode == 2  # argparse: not both

        long = harness.write_graph(tmp_path / "long.json", harness.iris_graph(10**6))
        proc = sc.cli("run", str(long), "--no-wait", "--name", "background")
        assert proc.returncode == 0
        run_id = proc.stdout.strip()
        assert len(run_id) == 32 and "\n" not in run_id  # only the id on stdout, for scripts
        sc.wait_for(run_id, "progress")
        proc = sc.cli("cancel", run_id[:8], "--reason", "done testing")
        assert proc.returncode == 0 and run_id in proc.stdout
        assert sc.finish(run_id)["status"] == "cancelled"

        listing = json.loads(sc.cli("runs", "--json", "--status", "cancelled,failed", check=True).stdout)
        assert {r["status"] for r in listing["runs"]} == {"cancelled", "failed"} and listing["total"] == 2
        table = sc.cli("runs", "--limit", "2", check=True).stdout.splitlines()
        assert table[0].split()[:2] == ["ID", "STATUS"] and len(table) == 4 and "(2 of 4 runs" in table[-1]
        assert sc.cli("cancel", "0000").returncode == 2
    finally:
        pid = sc.pid
        proc = sc.cli("stop")
        assert proc.returncode == 0 and "stopped" in proc.stdout
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        assert not (sc.home / "runtime.json").exists()
    assert sc.cli("status").returncode == 3


def test_start_reports_a_port_in_use_and_the_console_script_exists(tmp_path):
    sc = harness.Sidecar(tmp_path / "a").start()
    try:
        other = harness.Sidecar(tmp_path / "b")
        proc = other.cli("start", "--port", str(sc.info["port"]))
        assert proc.returncode == 1 and "cannot listen on 127.0.0.1" in proc.stderr and "--port" in proc.stderr
        assert not (tmp_path / "b" / "runtime.json").exists()
    finally:
        sc.stop()
    exe = shutil.which("xpufleet")
    if exe is not None:  # installed with pip install -e .
        out = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("xpufleet ")
    help_text = harness.Sidecar(tmp_path / "c").cli("--help").stdout
    for word in ("start", "stop", "status", "run", "runs", "cancel", "Exit codes"):
        assert word in help_text
