"""A control-plane host: ``pip install xpufleet`` (no extras) into a fresh venv without torch, then
``xpufleet start``; a run queued there is routed to an agent in another environment that has torch, and a
local run is refused with what to install (docs/install.md)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import arch_imports as arch
import graph_parts as gp  # registered by tests/conftest.py
import pytest
from processes import wait_until  # registered by tests/conftest.py

from xpufleet.common.client import ApiError, Client
from xpufleet.common.runtime_file import read_runtime
from xpufleet.constants import TERMINAL_STATUSES

pytestmark = pytest.mark.e2e

GRAPH = gp.iris(strategy="single")  # the e2e suites' iris graph (tests/graph_parts.py)


@pytest.mark.timeout(900)
def test_a_server_without_torch_routes_runs_to_a_worker_with_torch(tmp_path):
    wheel_dir = tmp_path / "wheel"
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheel_dir),
                            str(arch.REPO)], capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr
    (wheel,) = wheel_dir.glob("xpufleet-*.whl")
    env_dir = tmp_path / "control"
    venv.create(env_dir, system_site_packages=False, with_pip=True)  # nothing of this machine's packages
    python = env_dir / "bin" / "python"
    done = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    for absent in ("torch", "numpy", "sklearn", "optuna"):
        probe = subprocess.run([str(python), "-c", f"import {absent}"], capture_output=True, text=True, timeout=60)
        assert probe.returncode != 0, f"{absent} is installed in the control-plane venv"

    home = tmp_path / "home"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XPUFLEET_HOME")}
    env.update(XPUFLEET_HOME=str(home), XPUFLEET_HEARTBEAT_INTERVAL_S="1")
    started = subprocess.run([str(env_dir / "bin" / "xpufleet"), "start", "--port", "0"], env=env,
                             capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    info = read_runtime(home)
    client = Client(info["url"], info["token"], timeout=60)
    agent = None
    try:
        pid_python = subprocess.run(["readlink", "-f", f"/proc/{info['pid']}/exe"], capture_output=True,
                                    text=True).stdout.strip()
        assert pid_python.startswith(str(env_dir)) or Path(pid_python).resolve() == python.resolve()
        # the worker: this test's own environment, which has torch
        agent = subprocess.Popen([sys.executable, "-m", "xpufleet.server", "agent", "start", "--foreground",
                                  "--name", "gpu-box", "--simulate", "cuda:0=24"], env=env,
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path)
        def online() -> bool:
            try:
                return client.request("GET", "/api/workers/gpu-box").get("status") == "Online"
            except ApiError as exc:  # 404 until it has said hello
                assert exc.status == 404, exc
                return False

        wait_until(online, "the agent joins", 120)
        run_id = client.submit(GRAPH, {"target": "any"})["run_id"]
        run = wait_until(lambda: (r := client.run(run_id))["status"] in TERMINAL_STATUSES and r, "the run ends", 120)
        assert run["status"] == "succeeded", run.get("error")
        assert run["worker_id"] == "gpu-box" and run["final_metrics"]["train_loss"] > 0
        with pytest.raises(ApiError) as refused:
            client.submit(GRAPH, {"target": "local"})
        assert refused.value.status == 400
        assert "this server cannot run graphs" in str(refused.value) and "xpufleet[train]" in str(refused.value)
        with pytest.raises(ApiError) as refused:  # no optuna here: a study says what to install
            client.request("POST", "/api/studies", {"graph": GRAPH, "parameters": {"5.lr": {"low": 0.001, "high": 0.1}},
                                                    "objective": {"metric": "val_loss", "direction": "minimize"},
                                                    "n_trials": 2})
        assert refused.value.status == 400 and "xpufleet[studies]" in str(refused.value)
    finally:
        if agent is not None:
            agent.terminate()
            agent.wait(timeout=60)
        subprocess.run([str(env_dir / "bin" / "xpufleet"), "stop"], env=env, capture_output=True, timeout=120)
