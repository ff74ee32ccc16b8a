"""The example graphs in samples/, run through the graph executor (and hosted the way ComfyUI loads us)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from xpufleet.nodes import NODE_CLASS_MAPPINGS, runtime
from xpufleet.server.run.executor import execute_graph, validate_graph

EXAMPLES = Path(__file__).resolve().parents[2] / "samples"
NODE_EXAMPLES = ["mlp_digits", "cnn_digits", "predict_saved", "ddp_digits"]


def example(name: str) -> dict:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


def by_class(graph: dict, class_type: str) -> str:
    (nid,) = [k for k, v in graph.items() if v["class_type"] == class_type]
    return nid


@pytest.mark.parametrize("name", NODE_EXAMPLES)
def test_examples_validate(name):
    graph = example(name)
    assert validate_graph(graph) == []
    assert {v["class_type"] for v in graph.values()} <= set(NODE_CLASS_MAPPINGS)


def run_example(name: str, make_run, **ctx_fields):
    graph = example(name)
    run = make_run(**ctx_fields)
    result = execute_graph(graph, run.ctx)
    return graph, run, result


def test_mlp_digits_trains_saves_and_predict_saved_reads_it(make_run, xpufleet_home, tmp_path):
    graph, run, result = run_example("mlp_digits", make_run, seed=0)
    evaluate = by_class(graph, "XPUEvaluate")
    (metrics,) = result.outputs[evaluate]
    assert metrics["accuracy"] >= 0.90 and metrics["n_samples"] == 359
    train_id = by_class(graph, "XPUTrainingLoop")
    train_metrics = result.outputs[train_id][1]
    assert train_metrics["final_val_accuracy"] == pytest.approx(metrics["accuracy"])
    saved = Path(result.outputs[by_class(graph, "XPUModelSaver")][0])
    assert saved == xpufleet_home / "outputs" / "models" / "mlp_digits.safetensors" and saved.is_file()
    run_dir = tmp_path / "run"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == ["epoch_0010.pt", "epoch_0020.pt"]
    assert any((run_dir / "tensorboard").iterdir())
    # events carry the node they came from
    assert {p["node"] for p in run.metrics("val_accuracy")} == {train_id}
    assert {p["node"] for p in run.of("node_finished")} == set(graph)

    pgraph, prun, presult = run_example("predict_saved", make_run)
    preds, summary = presult.outputs[by_class(pgraph, "XPUPredict")]
    (pmetrics,) = presult.outputs[by_class(pgraph, "XPUEvaluate")]
    assert preds.shape == (359,)
    assert pmetrics["accuracy"] == pytest.approx(metrics["accuracy"])  # the same model on the same split
    assert f"accuracy vs labels {metrics['accuracy']:.4f}" in summary


def test_cnn_digits(make_run, xpufleet_home, tmp_path):
    graph, run, result = run_example("cnn_digits", make_run, seed=0)
    (metrics,) = result.outputs[by_class(graph, "XPUEvaluate")]
    assert metrics["accuracy"] >= 0.90
    saved = Path(result.outputs[by_class(graph, "XPUModelSaver")][0])
    assert saved.suffix == ".pt" and saved.is_file()
    steps = result.outputs[by_class(graph, "XPUTrainingLoop")][1]["steps"]
    assert len(list((tmp_path / "run" / "checkpoints").glob("step_*.pt"))) == steps // 100


def test_ddp_digits_falls_back_and_still_trains(make_run, xpufleet_home):
    graph, run, result = run_example("ddp_digits", make_run, seed=0)
    (w,) = run.warnings("ddp_not_available")
    assert w["node"] == by_class(graph, "XPUTrainingLoop")
    assert "ddp needs a queued run on a worker with two or more cards" in w["message"]
    (metrics,) = result.outputs[by_class(graph, "XPUEvaluate")]
    assert metrics["accuracy"] >= 0.90


def test_stop_during_an_example_writes_the_interrupt_checkpoint(make_run, xpufleet_home, tmp_path):
    run = make_run(seed=0)
    emit = run.ctx.emit

    def emit_and_stop(type_, payload):
        emit(type_, payload)
        if type_ == "metric" and payload["name"] == "train_loss" and payload["epoch"] == 3:
            run.ctx.stop_event.set()

    run.ctx.emit = emit_and_stop
    with pytest.raises(runtime.RunStopped):
        execute_graph(example("mlp_digits"), run.ctx)
    assert (tmp_path / "run" / "checkpoints" / "interrupt.pt").is_file()
    assert not (xpufleet_home / "outputs" / "models" / "mlp_digits.safetensors").exists()  # saver never ran


def test_hosted_in_comfyui_progress_goes_to_the_progress_bar(comfy_host, xpufleet_home):
    _instance, load = comfy_host
    module = load()
    import comfy.utils
    import execution  # the stand-in of ComfyUI's executor: inference mode, progress hook, cache
    import folder_paths

    comfy.utils.UPDATES.clear()
    assert set(NODE_CLASS_MAPPINGS) <= set(module.NODE_CLASS_MAPPINGS)
    graph = example("mlp_digits")
    host = execution.PromptExecutor(module.NODE_CLASS_MAPPINGS)
    host.execute(graph)
    assert host.success, host.status_messages
    shown = host.history_result["outputs"]
    assert shown[by_class(graph, "XPUEvaluate")]["metrics"][0]["accuracy"] >= 0.90
    total = 20 * 23
    assert comfy.utils.UPDATES and comfy.utils.UPDATES[-1] == (total, total)
    assert {p["node"] for p in host.progress} == {by_class(graph, "XPUTrainingLoop")}  # shown on the node
    # no run directory: checkpoints go to a fresh folder under ComfyUI's output/xpufleet
    out = Path(folder_paths.get_output_directory()) / "xpufleet"
    assert list((out / "runs").glob("*/checkpoints/epoch_0020.pt"))
    assert (out / "models" / "mlp_digits.safetensors").is_file()
    assert not (xpufleet_home / "outputs").exists()


def test_importing_the_nodes_stays_cheap():
    code = ("import sys, xpufleet, xpufleet.nodes; "
            "print(sorted(m for m in ('torch', 'sklearn', 'numpy', 'safetensors', 'tensorboard') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"
