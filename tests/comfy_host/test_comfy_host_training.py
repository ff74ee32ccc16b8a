"""Training in a real ComfyUI (0.3.64 or 0.33.0), queued as the front end queues it (POST /prompt, /ws, /history):
every example graph, the figures of `xpufleet run --local`, a save in one prompt and a load in the next,
Cancel mid-training, the caching rule, and a node error naming the node and its input."""

from __future__ import annotations

import copy
import json
import re
import shutil
import time
from pathlib import Path
from typing import Any

import comfy_harness  # registered by tests/comfy_host/conftest.py
import graph_parts as gp  # registered by tests/conftest.py
import pytest
import torch

pytestmark = pytest.mark.comfy

EXAMPLES = Path(__file__).resolve().parents[2] / "samples"
# Graphs that load what another one saves run after it (predict_saved loads mlp_digits' model).
ORDER = sorted((p.stem for p in EXAMPLES.glob("*.json") if not p.name.startswith("serve_")),  # serve_*: services
               key=lambda n: ("XPUModelLoader" in (EXAMPLES / f"{n}.json").read_text(), n))


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def example_runs(comfyui) -> dict[str, comfy_harness.PromptResult]:
    """Every graph in samples/ queued once, in ORDER."""
    return {name: comfyui.run_prompt(example(name)) for name in ORDER}


@pytest.mark.parametrize("name", ORDER)
def test_every_example_succeeds_with_its_metrics(comfyui, example_runs, name):
    graph, run = example(name), example_runs[name]
    assert run.succeeded, json.dumps(run.history["status"])[:3000]
    assert "execution_error" not in run.messages and "execution_interrupted" not in run.messages
    assert run.outputs, "the graph's output nodes showed nothing"
    evaluations = [run.metrics(k) for k, v in graph.items() if v["class_type"] == "XPUEvaluate"]
    for evaluate in evaluations:  # the examples classify the digits' 359 validation samples
        assert evaluate["accuracy"] > 0.9 and evaluate["n_samples"] == 359 and evaluate["loss"] > 0
    loops = [k for k, v in graph.items() if v["class_type"] == "XPUTrainingLoop"]
    for nid in loops:
        trained = run.metrics(nid)
        assert trained["epochs_completed"] == graph[nid]["inputs"]["epochs"]
        if evaluations:  # the same model on the same split
            assert trained["final_val_accuracy"] == evaluations[0]["accuracy"]
        assert trained["strategy"] == "single" and trained["device"] == "cpu"
        progress = [e["data"] for e in run.events if e["type"] == "progress" and e["data"]["node"] == nid]
        assert progress and progress[-1]["value"] == progress[-1]["max"] == trained["steps"]  # on the node
        for ck in trained["checkpoints"]:
            assert Path(ck).is_file() and Path(ck).is_relative_to(comfyui.base / "output" / "xpufleet" / "runs")
    warnings = [w for nid in loops for w in run.outputs[nid].get("warnings", [])]
    if any(graph[nid]["inputs"].get("strategy") == "ddp" for nid in loops):
        # the canvas Run is ComfyUI's own process: ddp falls back, and the node says so
        assert [w["kind"] for w in warnings] == ["ddp_not_available"], warnings
        assert "ddp_not_available" in " ".join(run.outputs[loops[0]]["text"])
    else:
        assert warnings == []
    for nid in (k for k, v in graph.items() if v["class_type"] == "XPUModelSaver"):
        saved = Path(run.outputs[nid]["text"][0])
        assert saved.is_file() and saved.parent == comfyui.base / "output" / "xpufleet" / "models"


def test_a_model_saved_in_one_prompt_loads_in_the_next(comfyui, example_runs):
    trained = example_runs["mlp_digits"].metrics("9")
    loaded = example_runs["predict_saved"]  # ModelLoader found output/xpufleet/models/mlp_digits.safetensors
    assert loaded.metrics("5") == trained
    assert "accuracy vs labels" in loaded.outputs["4"]["text"][0]
    # a model placed in ComfyUI's models/xpufleet folder loads by its bare name
    models = comfyui.base / "models" / "xpufleet"
    models.mkdir(parents=True, exist_ok=True)
    shutil.copy(comfyui.base / "output" / "xpufleet" / "models" / "mlp_digits.safetensors", models / "digits.safetensors")
    graph = example("predict_saved")
    graph["1"]["inputs"]["path"] = "digits.safetensors"
    again = comfyui.run_prompt(graph)
    assert again.succeeded and again.metrics("5") == trained


def _summary_figures(stdout: str) -> dict[str, str]:
    return dict(re.findall(r"^\s+(val_accuracy|val_loss|train_loss|eval_accuracy|eval_loss)\s+(\S+)$", stdout, re.M))


def test_the_same_figures_as_xpufleet_run_local(comfyui, example_runs, tmp_path):
    proc = comfy_harness.xpufleet_cli("run", "--local", str(EXAMPLES / "mlp_digits.json"), "--output-dir",
                                      str(tmp_path / "run"), home=tmp_path / "home", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    local = _summary_figures(proc.stdout)
    hosted = example_runs["mlp_digits"]
    loop, evaluate = hosted.metrics("8"), hosted.metrics("9")
    figures = {"val_accuracy": loop["final_val_accuracy"], "val_loss": loop["final_val_loss"],
               "train_loss": loop["final_train_loss"], "eval_accuracy": evaluate["accuracy"],
               "eval_loss": evaluate["loss"]}
    assert local == {k: f"{v:.6g}" for k, v in figures.items()}, proc.stdout


def test_cancel_stops_after_the_batch_with_the_interrupt_checkpoint(comfyui):
    graph = example("mlp_digits")
    graph["8"]["inputs"].update(epochs=100_000, tensorboard=False, checkpoint_every=0)
    seen: dict[str, Any] = {}
    started = time.time()

    async def cancel_at_first_progress(event: dict[str, Any], session: Any) -> None:
        if event["type"] == "progress" and event["data"]["node"] == "8" and "progress" not in seen:
            seen["progress"] = event["data"]
            async with session.post("/interrupt", json={}) as resp:  # ComfyUI's Cancel button
                assert resp.status == 200

    run = comfyui.run_prompt(graph, on_event=cancel_at_first_progress)
    assert "progress" in seen
    interrupted = run.messages.get("execution_interrupted")
    assert interrupted is not None and interrupted["node_id"] == "8", run.history["status"]
    assert "execution_error" not in run.messages and not run.succeeded
    found = [p for p in (comfyui.base / "output" / "xpufleet" / "runs").glob("*/checkpoints/interrupt.pt")
             if p.stat().st_mtime >= started - 1]
    assert len(found) == 1, found
    state = torch.load(found[0], weights_only=True)
    assert state["reason"] == "interrupt" and state["step"] >= seen["progress"]["value"]
    assert re.search(r"stopped at epoch \d+, batch \d+, step \d+; interrupt checkpoint", comfyui.log())
    # ComfyUI takes the next prompt normally afterwards
    graph["8"]["inputs"].update(epochs=1)
    assert comfyui.run_prompt(graph).succeeded


IRIS: dict[str, Any] = {
    "1": gp.dataset(), "2": gp.loader("1"), "3": gp.mlp("1", seed=7), "4": gp.optimizer(), "5": gp.loss(),
    "6": gp.training_loop("3", "2", "4", "5", epochs=2, seed=3),
}


def test_caching_rule_seeded_graph_reuses_seed_minus_one_retrains(comfyui):
    first = comfyui.run_prompt(IRIS)
    again = comfyui.run_prompt(IRIS)
    assert first.succeeded and again.succeeded
    assert set(again.messages["execution_cached"]["nodes"]) == set(IRIS)  # nothing trained twice
    assert again.metrics("6") == first.metrics("6")
    unseeded = copy.deepcopy(IRIS)
    unseeded["6"]["inputs"]["seed"] = -1
    runs = [comfyui.run_prompt(unseeded) for _ in range(2)]
    for run in runs:
        assert run.succeeded and "6" not in run.messages["execution_cached"]["nodes"]
        assert any(e["type"] == "executing" and e["data"]["node"] == "6" for e in run.events)
    assert "3" in runs[1].messages["execution_cached"]["nodes"]  # the seeded builder stays cached


def test_a_node_error_names_the_node_and_the_input(comfyui, tmp_path):
    graph = copy.deepcopy(IRIS)
    graph["6"]["inputs"]["resume_from"] = "ck/missing.pt"  # relative: looked up where graphs may read
    run = comfyui.run_prompt(graph)
    error = run.messages["execution_error"]
    assert error["node_id"] == "6" and error["node_type"] == "XPUTrainingLoop"
    assert error["exception_message"].startswith("6 (XPUTrainingLoop): resume_from: the checkpoint 'ck/missing.pt' "
                                                 "not found")
    assert error["exception_type"] == "ValueError"


def test_comfyuis_validation_refuses_a_file_outside_its_folders_by_name(comfyui, tmp_path):
    """Issue 29: a canvas graph reads only ComfyUI's input/output/models folders (and data roots)."""
    graph = copy.deepcopy(IRIS)
    graph["1"]["inputs"].update(name="csv", path="/etc/shadow")
    graph["6"]["inputs"]["resume_from"] = str(tmp_path / "elsewhere.pt")
    with pytest.raises(comfy_harness.PromptRefused) as refused:
        comfyui.run_prompt(graph)
    errors = refused.value.body["node_errors"]
    assert set(errors) == {"1", "6"}, errors
    # ComfyUI lists the verdict once per input VALIDATE_INPUTS takes
    shadow = errors["1"]["errors"][0]
    assert shadow["type"] == "custom_validation_failed"
    assert "path '/etc/shadow' is outside the folders graphs may read" in shadow["details"]
    assert "ComfyUI's input folder" in shadow["details"] and "root:" not in json.dumps(refused.value.body)
    resume = errors["6"]["errors"][0]
    assert "resume_from '" in resume["details"] and "is outside the folders graphs may read" in resume["details"]
