"""The output recorder (docs/workers.md): each kind of node output, the index a reader sees during the run, and a
recording failure that warns instead of failing the run. Real tensors, a real model, real safetensors."""

from __future__ import annotations

import json

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py
import torch
from safetensors.torch import load_file

from xpufleet.server.run.executor import execute_graph
from xpufleet.server.run.outputs import OutputRecorder, record_mode, safe_name


class Node:
    RETURN_TYPES = ("XPU_TENSOR", "XPU_MODEL", "XPU_METRICS", "STRING", "STRING", "INT", "XPU_DATASET")
    RETURN_NAMES = ("pred", "model", "metrics", "summary", "long", "count", "data")


class Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def test_record_mode():
    assert record_mode({}) is None and record_mode({"record_outputs": False}) is None
    assert record_mode({"record_outputs": True}) == "keep"
    assert record_mode({"record_outputs": "upload"}) == "upload"
    assert safe_name("../x y") == "x_y" and safe_name("") == "x"


def test_each_kind_of_output(tmp_path):
    warnings: list[tuple[str, str]] = []
    rec = OutputRecorder(tmp_path, "r1", "keep", warn=lambda k, m: warnings.append((k, m)))
    index = json.loads((tmp_path / "recorded_outputs" / "index.json").read_text())
    assert index == {"run_id": "r1", "mode": "keep", "complete": False, "nodes": []}
    model = torch.nn.Sequential(torch.nn.Linear(3, 2))
    model.xpu_spec = {"builder": "test", "args": {"in": 3}}
    pred = torch.arange(6, dtype=torch.float32).reshape(2, 3).requires_grad_()
    outputs = (pred, model, {"loss": torch.tensor(0.5), "hist": [1.0, float("nan")]}, "ok", "x" * 300_000, 7,
               object())
    rec.record("7", "Test", Node, outputs, {"text": ["shown"]})
    manifest = json.loads((tmp_path / "recorded_outputs" / "7" / "outputs.json").read_text())
    kinds = [o["kind"] for o in manifest["outputs"]]
    assert kinds == ["tensor", "model", "metrics", "text", "text", "value", "summary"]
    t, m, metrics, short, long, count, summary = manifest["outputs"]
    assert t["shape"] == [2, 3] and t["dtype"] == "float32"
    assert torch.equal(load_file(tmp_path / "recorded_outputs" / "7" / t["file"])["pred"], pred.detach())
    weights = load_file(tmp_path / "recorded_outputs" / "7" / m["file"])
    assert set(weights) == {"0.weight", "0.bias"} and m["parameters"] == 8 and m["spec"]["builder"] == "test"
    assert metrics["value"] == {"loss": 0.5, "hist": [1.0, None]}  # NaN is not JSON
    assert short["value"] == "ok" and long["chars"] == 300_000 and "value" not in long
    assert (tmp_path / "recorded_outputs" / "7" / long["file"]).read_text() == "x" * 300_000
    assert count["value"] == 7 and summary["python_type"] == "builtins.object"
    assert manifest["ui"] == {"text": ["shown"]}
    index = json.loads((tmp_path / "recorded_outputs" / "index.json").read_text())
    (entry,) = index["nodes"]  # a reader during the run sees the nodes finished so far
    assert entry["node"] == "7" and set(entry["files"]) == {"outputs.json", t["file"], m["file"], long["file"]}
    assert entry["bytes"] > 300_000
    # one output that cannot be recorded: a warning, the run goes on, the node is not listed
    rec.record("8", "Test", Node, (Unprintable(),), None)
    assert warnings and warnings[0][0] == "record_outputs_failed" and "node 8" in warnings[0][1]
    done = rec.finish()
    assert done["nodes"] == 1 and done["mode"] == "keep"
    assert json.loads((tmp_path / "recorded_outputs" / "index.json").read_text())["complete"] is True


def test_the_executor_hands_each_finished_node_to_the_hook(tmp_path):
    seen: list[tuple[str, str, int]] = []
    result = execute_graph(harness.iris_graph(1), on_outputs=lambda nid, ct, cls, outs, ui: seen.append(
        (nid, ct, len(outs))))
    assert [s[0] for s in seen] == result.order
    assert ("7", "XPUTrainingLoop", 2) in seen and ("1", "XPUDataset", 3) in seen


@pytest.mark.parametrize("mode", ["keep", "upload"])
def test_recorder_keeps_its_mode(tmp_path, mode):
    rec = OutputRecorder(tmp_path, None, mode)
    assert rec.finish() == {"nodes": 0, "bytes": 0, "mode": mode}
