"""The nodes hosted the way ComfyUI runs them (the stand-in executor in tests/comfy_standin/execution.py):
inside torch.inference_mode(), with ComfyUI's progress hook, its interrupt flag and its output cache.
The same checks against the real ComfyUI are in tests/comfy_host/."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path
from typing import Any

import graph_parts as gp  # registered by tests/conftest.py
import pytest
import torch

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import hostmode, runtime
from xpufleet.server.run.executor import execute_graph

EXAMPLES = Path(__file__).resolve().parents[2] / "samples"

# iris, a small MLP, a TrainingLoop (node 7) and an Evaluate (node 8, an output node).
IRIS: dict[str, Any] = gp.iris(epochs=3, strategy="single", seed=0)


def iris(**loop: Any) -> dict[str, Any]:
    g = copy.deepcopy(IRIS)
    g["7"]["inputs"].update(loop)
    return g


def example(name: str) -> dict[str, Any]:
    return json.loads((EXAMPLES / f"{name}.json").read_text())


@pytest.fixture
def host(comfy_host, xpufleet_home):
    """(PromptExecutor over the plugin as ComfyUI loads it, its folder_paths stand-in)."""
    _instance, load = comfy_host
    module = load()
    import execution
    import folder_paths

    return execution.PromptExecutor(module.NODE_CLASS_MAPPINGS), folder_paths


def test_examples_train_under_inference_mode_with_the_metrics_of_a_local_run(host, make_run):
    executor, folder_paths = host
    graph = example("mlp_digits")
    graph["8"]["inputs"].update(epochs=4, checkpoint_every=2, tensorboard=False)
    executor.execute(graph)
    assert executor.success, executor.status_messages
    shown = executor.history_result["outputs"]
    hosted = shown["8"]["metrics"][0]
    assert hosted["epochs_completed"] == 4 and hosted["final_val_accuracy"] > 0.8
    assert "val_accuracy" in shown["8"]["text"][0]
    # the same graph and seed through our executor (what `xpufleet run --local` runs): the same figures
    run = make_run()
    local = execute_graph(graph, run.ctx)
    (_, local_metrics) = local.outputs["8"]
    for key in ("final_train_loss", "final_val_loss", "final_val_accuracy", "steps"):
        assert hosted[key] == local_metrics[key], key
    assert shown["9"]["metrics"][0] == local.ui["9"]["metrics"][0]
    assert json.loads(json.dumps(shown))  # /history is JSON
    out = Path(folder_paths.get_output_directory()) / "xpufleet"
    assert len(list((out / "runs").glob("*/checkpoints/epoch_000[24].pt"))) == 2


def test_a_dataset_of_inference_tensors_still_trains(host):
    """A dataset whose batches are views of tensors made under inference mode (no gather, no stack)."""

    class Views(torch.utils.data.Dataset):
        def __init__(self) -> None:
            with torch.inference_mode():
                self.x = torch.randn(64, 4)
                self.y = (self.x.sum(1) > 0).long()
            self.info = {"task": "classification"}

        def __len__(self) -> int:
            return 4

        def __getitem__(self, i: int):
            return self.x[i * 16:(i + 1) * 16], self.y[i * 16:(i + 1) * 16]

    data = Views()
    loader = torch.utils.data.DataLoader(data, batch_size=1, collate_fn=lambda b: b[0])
    assert next(iter(loader))[0].is_inference()
    with torch.inference_mode():  # as ComfyUI calls every node
        (model,) = N["XPUMLP"]().build("8", in_features=4, out_features=2)
        (opt,) = N["XPUOptimizer"]().make("sgd", 0.5)
        (loss,) = N["XPULoss"]().make("cross_entropy")
        out = N["XPUTrainingLoop"]().train(model, loader, opt, loss, epochs=20, device="cpu", tensorboard=False)
    trained, metrics = out["result"]
    assert metrics["train_loss"][-1] < metrics["train_loss"][0]
    assert not any(p.is_inference() for p in trained.parameters())
    assert all(p.is_inference() for p in model.parameters())  # the builder's output stays as built


def test_evaluate_and_predict_keep_inference_mode(digits, loaders, build_mlp, monkeypatch):
    from xpufleet.nodes import trainer

    model = build_mlp(digits[2], "8")
    modes = []

    def spy(name: str) -> None:
        real = getattr(trainer, name)

        def call(*args, **kwargs):
            modes.append((name, torch.is_inference_mode_enabled()))
            return real(*args, **kwargs)

        monkeypatch.setattr(trainer, name, call)

    spy("evaluate")
    spy("predict_outputs")
    N["XPUPredict"]().predict(model, "classes", "cpu", 64, dataset=digits[1])
    N["XPUEvaluate"]().evaluate(model, loaders[1], "cpu")
    assert modes == [("predict_outputs", True), ("evaluate", True)]  # even outside ComfyUI
    assert torch.is_grad_enabled() and not torch.is_inference_mode_enabled()  # nothing leaks out


def test_progress_on_the_node_and_a_cancel_inside_the_progress_hook(host, tmp_path):
    """ComfyUI's progress hook raises on Cancel: the loop still stops after the batch, writes its
    interrupt checkpoint, and the prompt ends interrupted, not failed."""
    executor, _ = host
    import comfy.model_management as mm

    real_hook = executor._hook

    def cancel_on_first_update(value, total, preview, prompt_id=None, node_id=None):
        mm.interrupt_current_processing(True)  # Cancel pressed just before this update
        real_hook(value, total, preview, prompt_id, node_id)

    executor._hook = cancel_on_first_update
    executor.execute(iris(epochs=100_000, checkpoint_dir="ck"))
    assert not executor.success
    interrupted = executor.message("execution_interrupted")
    assert interrupted is not None and interrupted["node_id"] == "7", executor.status_messages
    assert executor.message("execution_error") is None
    state = torch.load(tmp_path / "comfy" / "output" / "xpufleet" / "ck" / "interrupt.pt", weights_only=True)
    assert state["reason"] == "interrupt" and state["step"] >= 1
    assert mm.processing_interrupted() is False  # cleared, as ComfyUI clears it


def test_cancel_between_progress_updates(host, tmp_path):
    executor, _ = host
    import comfy.model_management as mm

    real_hook = executor._hook

    def cancel_after_update(value, total, preview, prompt_id=None, node_id=None):
        real_hook(value, total, preview, prompt_id, node_id)
        mm.interrupt_current_processing(True)  # Cancel pressed while the next batch trains

    executor._hook = cancel_after_update
    executor.execute(iris(epochs=100_000, checkpoint_dir="ck"))
    assert executor.message("execution_interrupted") is not None, executor.status_messages
    first = executor.progress[0]
    state = torch.load(tmp_path / "comfy" / "output" / "xpufleet" / "ck" / "interrupt.pt", weights_only=True)
    assert state["step"] == first["value"] + 1  # stopped after the batch that was running
    assert first["node"] == "7" and first["max"] == 100_000 * 8


def test_caching_rule_seeded_reuses_unseeded_retrains(host):
    executor, _ = host
    executor.execute(iris())
    assert executor.success and "7" in executor.executed
    first = executor.history_result["outputs"]["7"]["metrics"][0]
    executor.execute(iris())  # seeded and unchanged: ComfyUI reuses the trained model
    assert executor.success and executor.executed == []
    assert executor.history_result["outputs"]["7"]["metrics"][0] == first
    executor.execute(iris(epochs=4))  # a changed input trains again; upstream stays cached
    assert executor.executed == ["7", "8"]
    executor.execute(iris(epochs=4, seed=-1))
    assert executor.executed == ["7", "8"]
    executor.execute(iris(epochs=4, seed=-1))  # unseeded: every queue trains again
    assert executor.executed == ["7", "8"]
    unseeded_model = iris(epochs=4)
    unseeded_model["4"]["inputs"]["seed"] = -1
    executor.execute(unseeded_model)
    executor.execute(unseeded_model)  # fresh weights on every queue, so the loop trains again too
    assert executor.executed == ["4", "7", "8"]


def test_a_changed_resume_checkpoint_retrains(tmp_path):
    ck = tmp_path / "ck.pt"
    key = N["XPUTrainingLoop"].IS_CHANGED(seed=0, resume_from=str(ck))
    assert key != key  # missing: always run, so the error shows
    ck.write_bytes(b"x")
    first = N["XPUTrainingLoop"].IS_CHANGED(seed=0, resume_from=str(ck))
    assert first == N["XPUTrainingLoop"].IS_CHANGED(seed=0, resume_from=str(ck))
    linked = N["XPUTrainingLoop"].IS_CHANGED(seed=None)  # a linked seed: ComfyUI passes None
    assert linked == N["XPUTrainingLoop"].IS_CHANGED(seed=None)
    # one NaN object would equal itself in ComfyUI's cache key (identity first): each is fresh
    assert hostmode.seed_rerun_key(-1) is not hostmode.seed_rerun_key(-1)


def test_a_model_saved_by_one_prompt_loads_in_the_next(host):
    executor, folder_paths = host
    train = example("mlp_digits")
    train["8"]["inputs"].update(epochs=2, checkpoint_every=0, tensorboard=False)
    executor.execute(train)
    assert executor.success, executor.status_messages
    trained_eval = executor.history_result["outputs"]["9"]["metrics"][0]
    saved = Path(executor.history_result["outputs"]["10"]["text"][0])
    assert saved == Path(folder_paths.get_output_directory()) / "xpufleet" / "models" / "mlp_digits.safetensors"
    executor.execute(example("predict_saved"))
    assert executor.success, executor.status_messages
    assert executor.history_result["outputs"]["5"]["metrics"][0] == trained_eval
    # a model put in ComfyUI's models/xpufleet folder loads by its bare name
    models = Path(folder_paths.models_dir) / "xpufleet"
    models.mkdir(parents=True)
    shutil.copy(saved, models / "digits.safetensors")
    again = example("predict_saved")
    again["1"]["inputs"]["path"] = "digits.safetensors"
    executor.execute(again)
    assert executor.success, executor.status_messages
    assert executor.history_result["outputs"]["5"]["metrics"][0] == trained_eval


def test_a_node_error_names_the_node_and_the_input(host, tmp_path):
    executor, _ = host
    executor.execute(iris(resume_from="ck/missing.pt"))
    error = executor.message("execution_error")
    assert error is not None and error["node_id"] == "7" and error["node_type"] == "XPUTrainingLoop"
    assert error["exception_message"].startswith("7 (XPUTrainingLoop): resume_from: the checkpoint 'ck/missing.pt' "
                                                 "not found; looked in")
    assert runtime.current() is None
