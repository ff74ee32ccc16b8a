"""The run child (`python -m xpufleet.server.run.runner RUN_DIR --events-fd N`) on its own, as the sidecar
and the worker agent start it: spec.json in, JSON-line events out, stdin stop, always run_finished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py


def write_spec(run_dir: Path, graph: dict, **extra) -> Path:
    run_dir.mkdir(parents=True)
    spec = {"run_id": run_dir.name, "graph": graph, "options": {}, "devices": ["cpu"],
            "device_aliases": {"cpu": "cpu"}, "placement": "worker", "simulated": False, "env": {}, **extra}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    return run_dir


class Child:
    """A runner process with its events pipe read on a thread (as a parent would)."""

    def __init__(self, run_dir: Path) -> None:
        read_fd, write_fd = os.pipe()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "xpufleet.server.run.runner", str(run_dir), "--events-fd", str(write_fd)],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_fd,),
        )
        os.close(write_fd)
        self.events: list[dict] = []
        self.progressed = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as f:
            for line in f:
                ev = json.loads(line)
                self.events.append(ev)
                if ev["type"] == "progress":
                    self.progressed.set()

    def wait(self, timeout: float = 90) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(timeout)
        return rc


def test_a_graph_that_fails_validation_ends_failed_with_comfyui_shaped_errors(tmp_path):
    run_dir = write_spec(tmp_path / "r1", {"1": {"class_type": "NoSuchNode", "inputs": {}},
                                           "2": {"class_type": "XPULoss", "inputs": {"name": "nope"}}})
    child = Child(run_dir)
    assert child.wait() == 1
    events = child.events
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert [e["type"] for e in events] == ["run_started", "run_finished"]
    fin = events[-1]["payload"]
    assert fin["status"] == "failed" and fin["error"].startswith("the graph failed validation")
    assert set(fin["validation"]["node_errors"]) == {"1", "2"}
    assert fin["validation"]["node_errors"]["2"]["errors"][0]["type"] == "value_not_in_list"
    assert fin["peak_memory"] == {"measured": False, "reason": "the run did not use torch"}
    assert fin["execution_facts"]["placement"] == "worker" and fin["execution_facts"]["visible_devices"] == ["cpu"]
    # The same events were appended to events.jsonl (a parent that died can recover them).
    logged = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert logged == events



def test_a_deterministic_run_sets_cublas_workspace_config_before_any_device_call(tmp_path):
    run_dir = write_spec(tmp_path / "r1", {"1": {"class_type": "NoSuchNode", "inputs": {}}},
                         options={"deterministic": True})
    child = Child(run_dir)
    assert child.wait() == 1
    facts = child.events[-1]["payload"]["execution_facts"]
    assert facts["cublas_workspace_config"] == (os.environ.get("CUBLAS_WORKSPACE_CONFIG") or ":4096:8")

@pytest.mark.e2e
def test_stop_on_stdin_cancels_and_a_closed_stdin_interrupts(tmp_path):
    graph = harness.iris_graph(10**6)
    stop = Child(write_spec(tmp_path / "stop", graph, options={"seed": 5}))
    gone = Child(write_spec(tmp_path / "gone", graph))
    for child in (stop, gone):
        assert child.progressed.wait(90), "no progress event"
    stop.proc.stdin.write(b"stop\n")
    stop.proc.stdin.flush()
    gone.proc.stdin.close()  # what a parent that died looks like
    assert stop.wait() == 1 and gone.wait() == 1
    fin = stop.events[-1]["payload"]
    assert (fin["status"], fin["error"]) == ("cancelled", "cancelled by request")
    assert "train_loss_batch" in fin["final_metrics"]
    kinds = [e["payload"].get("reason") for e in stop.events if e["type"] == "artifact"]
    assert "interrupt" in kinds  # TrainingLoop wrote its interrupt checkpoint
    fin = gone.events[-1]["payload"]
    assert fin["status"] == "interrupted" and "went away" in fin["error"]
    for child in (stop, gone):
        types = [e["type"] for e in child.events]
        assert types[0] == "run_started" and types[-1] == "run_finished" and types.count("run_finished") == 1
        assert [e["seq"] for e in child.events] == list(range(1, len(types) + 1))
