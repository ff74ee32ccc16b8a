"""`xpufleet agent ...` / `xpufleet workers ...` argument handling that needs no sidecar (docs/workers.md, docs/sidecar.md)."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from xpufleet.server.agent.agent import default_name
from xpufleet.server.agent.config import state_file
from xpufleet.server.cli import agent as agent_cli
from xpufleet.server.cli import workers as workers_cli


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "XPUFLEET_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "xpufleet.server", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="xpufleet")
    sub = parser.add_subparsers(dest="command")
    agent_cli.add_parser(sub)
    workers_cli.add_parser(sub)
    return parser


@pytest.mark.parametrize("argv", [["workers", "--json", "list"], ["workers", "list", "--json"],
                                  ["workers", "rejected", "--json"], ["workers", "drain", "box", "--json"],
                                  ["workers", "--json"]])
def test_workers_json_before_or_after_the_subcommand(argv):
    assert _parser().parse_args(argv).json is True


def test_workers_without_json_prints_text():
    assert _parser().parse_args(["workers", "list"]).json is False


@pytest.mark.parametrize("name", ["local", "ANY", "a!b", "gpu box"])
def test_agent_start_refuses_a_name_the_server_would_refuse_before_starting(tmp_path, name):
    proc = _cli(tmp_path, "agent", "start", "--name", name)
    assert proc.returncode == 2 and "invalid worker name" in proc.stderr and "not 'local' or 'any'" in proc.stderr
    assert not (tmp_path / "agents").exists()  # nothing started, nothing written


def test_agent_start_without_a_sidecar_says_what_to_do(tmp_path):
    proc = _cli(tmp_path, "agent", "start", "--simulate", "cuda:0=8")
    assert proc.returncode == 1 and "xpufleet start" in proc.stderr and "--server URL" in proc.stderr


def test_agent_stop_with_several_agents_and_no_name_asks_for_one(tmp_path):
    # Two processes that look like agents (their command line names one), with their state files.
    procs = [subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()", "agent"],
                              stdin=subprocess.PIPE) for _ in range(2)]
    names = ["zz-one", "zz-two"]
    assert default_name() not in names
    try:
        for name, proc in zip(names, procs, strict=True):
            path = state_file(tmp_path, name)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"name": name, "pid": proc.pid, "state": "connected"}))
        stop = _cli(tmp_path, "agent", "stop")
        assert stop.returncode == 2 and "2 worker agents run here (zz-one, zz-two): pass --name" in stop.stderr
        assert all(p.poll() is None for p in procs)  # nothing was stopped
        status = _cli(tmp_path, "agent", "status", "--json")
        assert status.returncode == 0
        assert {a["name"]: a["alive"] for a in json.loads(status.stdout)["agents"]} == dict.fromkeys(names, True)
    finally:
        for p in procs:
            p.stdin.close()
            p.wait(timeout=30)


def test_a_shared_card_prints_its_memory_and_runs():
    from xpufleet.server.cli.workers import memory_lines

    card = {"admits_by_memory": True, "total_gib": 24.0, "in_use_gib": 17.7, "reserved_gib": 0.0, "running_gib": 4.75,
            "context_gib": 0.75, "free_for_budgets_gib": 5.5, "note": None,
            "held_for": {"text": "held for run a1b2c3d4: later runs do not start here until it starts"},
            "runs": [{"id": "a1b2c3d4e5", "state": "running", "budget_gib": 4.0, "in_use_gib": 3.25}]}
    assert memory_lines(card) == [
        "memory: 17.7 GiB in use, 0 reserved, 4.75 running (budgets + 0.75 GiB CUDA context each), 5.5 GiB free for "
        "a new budget", "held for run a1b2c3d4: later runs do not start here until it starts",
        "run a1b2c3d4 running, budget 4 GiB, uses 3.25 GiB (NVML)"]
    assert memory_lines(None) == [] and memory_lines({"admits_by_memory": False, "note": "shared here, but"}) == [
        "shared here, but"]


def test_agent_start_with_a_folder_that_is_no_comfyui_says_so_before_starting(tmp_path):
    proc = _cli(tmp_path, "agent", "start", "--simulate", "cuda:0=8", "--comfyui", str(tmp_path))
    assert proc.returncode == 2
    assert f"--comfyui: {tmp_path.resolve()} is not a ComfyUI folder: it has no main.py" in proc.stderr
    assert not (tmp_path / "agents").exists()


def test_agent_start_takes_a_comfyui_and_its_interpreter(tmp_path):
    (tmp_path / "main.py").write_text("")
    args = _parser().parse_args(["agent", "start", "--comfyui", str(tmp_path), "--comfyui-python", sys.executable])
    cfg = agent_cli._config(args, tmp_path / "home")
    assert cfg.comfyui is not None and cfg.comfyui.path == tmp_path.resolve() and cfg.comfyui.python == sys.executable
