"""Every example exported with ``xpufleet export`` runs with plain python (importing xpufleet is made to
fail) and reaches the graph's metrics with the same seed: the same numbers, not just close ones."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from xpufleet.nodes import runtime
from xpufleet.server.run.executor import execute_graph

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EXAMPLES = Path(__file__).resolve().parents[3] / "samples"
SEED = 0


def graph_outputs(name: str, home: Path) -> tuple[dict, dict]:
    graph = json.loads((EXAMPLES / f"{name}.json").read_text())
    run_dir = home / f"graph-{name}"
    run_dir.mkdir()
    ctx = runtime.RunContext(emit=lambda t, p: None, seed=SEED, devices=["cpu"], run_dir=run_dir, placement="local")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the script runs with OMP_NUM_THREADS=1: the same reduction order
    try:
        return graph, execute_graph(graph, ctx).outputs
    finally:
        torch.set_num_threads(threads)


def export_and_run(name: str, home: Path, outputs: Path) -> tuple[subprocess.CompletedProcess, dict]:
    script = home / f"{name}.py"
    env = {**os.environ, "XPUFLEET_HOME": str(home), "OMP_NUM_THREADS": "1"}
    made = subprocess.run([sys.executable, "-m", "xpufleet.server", "export", str(EXAMPLES / f"{name}.json"),
                           "-o", str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert made.returncode == 0, made.stderr
    metrics = home / f"{name}-metrics.json"
    argv = [str(script), "--seed", str(SEED), "--device", "cpu", "--outputs", str(outputs),
            "--run-dir", str(home / f"script-{name}"), "--metrics", str(metrics)]
    # Plain python: any import of xpufleet inside the script would fail.
    code = (f"import runpy, sys; sys.modules['xpufleet'] = None; sys.argv = {argv!r}; "
            f"runpy.run_path({str(script)!r}, run_name='__main__')")
    ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600,
                         cwd=str(home))
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    return made, json.loads(metrics.read_text())


def assert_same(graph: dict, outputs: dict, script_metrics: dict) -> None:
    expected_nodes = {nid for nid, n in graph.items() if n["class_type"] in ("XPUTrainingLoop", "XPUEvaluate",
                                                                             "XPUPredict")}
    assert set(script_metrics) == expected_nodes
    for nid, got in script_metrics.items():
        ct = graph[nid]["class_type"]
        if ct == "XPUTrainingLoop":
            want = outputs[nid][1]
            for key in ("train_loss", "val_loss", "val_accuracy", "val_loss_step", "steps", "epochs_completed",
                        "effective_batch_size", "final_val_accuracy"):
                assert got[key] == want[key], (nid, key)
        elif ct == "XPUEvaluate":
            assert {k: got[k] for k in ("loss", "accuracy", "n_samples")} == \
                {k: outputs[nid][0][k] for k in ("loss", "accuracy", "n_samples")}
        else:
            assert got["summary"] == outputs[nid][1]


@pytest.mark.parametrize("name", ["mlp_digits", "cnn_digits", "ddp_digits"])
def test_an_exported_training_example_matches_the_graph(name, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("XPUFLEET_HOME", str(home))
    graph, outputs = graph_outputs(name, home)
    made, got = export_and_run(name, home, tmp_path / "script-outputs")
    assert_same(graph, outputs, got)
    if name == "ddp_digits":
        assert "warning (ddp_not_available): Node 8 (XPUTrainingLoop): strategy ddp" in made.stderr
    saved = list((tmp_path / "script-outputs" / "models").iterdir())
    assert len(saved) == 1  # loadable by XPU Fleet's own ModelLoader
    from xpufleet.nodes.io import load_model

    assert sum(p.numel() for p in load_model(saved[0]).parameters()) > 0


def test_the_exported_predict_example_reads_the_model_the_exported_training_saved(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("XPUFLEET_HOME", str(home))
    graph_outputs("mlp_digits", home)  # the graph side saves models/mlp_digits.safetensors under home/outputs
    pgraph, poutputs = graph_outputs("predict_saved", home)
    export_and_run("mlp_digits", home, tmp_path / "script-outputs")
    _, got = export_and_run("predict_saved", home, tmp_path / "script-outputs")
    assert_same(pgraph, poutputs, got)
