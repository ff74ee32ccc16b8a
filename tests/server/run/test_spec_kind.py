"""A run's kind in its spec (server/run/spec.py): filled from the graph by build_spec (server/comfyflow/kind.py),
checked when read, and the runner's dispatch of a ``comfyui`` run to comfy_client.py (no torch imported)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from xpufleet.server.run.spec import RunSpec, SpecError, build_spec

WORKFLOW = {"1": {"class_type": "EmptyImage", "inputs": {}}, "2": {"class_type": "SaveImage", "inputs": {}}}


def _spec(graph):
    return build_spec({"id": "r1", "graph": graph}, placement="worker", slot_devices=["cuda:2", "cuda:3"],
                      run_devices=["cuda:0", "cuda:1"], aliases={"cuda:0": "cuda:2", "cuda:1": "cuda:3"},
                      visible_devices=["cuda:0", "cuda:1"], worker="box")


def test_a_graph_with_a_foreign_node_is_a_comfyui_run_on_one_process():
    spec = _spec(WORKFLOW)
    assert spec.kind == "comfyui" and spec.world_size == 1 and spec.comfyui is None
    assert spec.execution_facts["run_kind"] == "comfyui"
    assert _spec({}).kind == "graph"


def test_the_kind_and_the_instance_round_trip_and_a_bad_kind_is_refused(tmp_path):
    spec = _spec(WORKFLOW)
    spec.comfyui = {"url": "http://127.0.0.1:1", "instance": "cuda:2+cuda:3", "started": True}
    spec.write(tmp_path)
    back = RunSpec.read(tmp_path)
    assert back.kind == "comfyui" and back.comfyui == spec.comfyui
    with pytest.raises(SpecError, match="kind must be one of graph, comfyui, got 'x'"):
        RunSpec(run_id="r", graph={}, kind="x")


def test_the_runner_hands_a_comfyui_run_to_the_comfy_client_without_torch(tmp_path):
    spec = _spec(WORKFLOW)
    spec.write(tmp_path)
    code = ("import sys, runpy; sys.argv = ['runner', sys.argv[1]]\n"
            "from xpufleet.server.run import runner\n"
            "rc = runner.run(__import__('pathlib').Path(sys.argv[1]), stdin=iter(()))\n"
            "print('TORCH', 'torch' in sys.modules); sys.exit(rc)")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "TORCH False" in done.stdout, done.stderr
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["run_started", "outputs_recorded", "run_finished"]
    finished = events[-1]["payload"]
    assert finished["error"] == "the run has no ComfyUI instance (spec.comfyui is missing)"
    assert finished["execution_facts"]["run_kind"] == "comfyui"
