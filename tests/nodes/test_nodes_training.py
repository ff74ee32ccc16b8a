"""TrainingLoop, Optimizer, LR scheduler, Loss and Evaluate nodes, trained for real on CPU."""

from __future__ import annotations

import math
import threading

import pytest
import torch

from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
from xpufleet.nodes import runtime
from xpufleet.nodes.specs import LossSpec, OptimizerSpec, SchedulerSpec
from xpufleet.nodes.trainer import load_checkpoint


def test_mlp_on_digits_reaches_90_percent(digits, loaders, build_mlp, train_node, make_run):
    model = build_mlp(digits[2])
    before = {k: v.clone() for k, v in model.state_dict().items()}
    tl, vl = loaders
    run = make_run(seed=0)
    with runtime.use(run.ctx):
        trained, metrics = train_node(model, tl, epochs=15, val_dataloader=vl)
    assert metrics["final_val_accuracy"] >= 0.90
    assert metrics["epochs_completed"] == 15 and metrics["steps"] == 15 * len(tl)
    assert metrics["train_loss"][-1] < metrics["train_loss"][0] / 5
    assert len(metrics["val_loss"]) == len(metrics["val_accuracy"]) == 15
    # the input model is untouched (ComfyUI caches node outputs); the output is a trained copy
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    assert trained is not model and not trained.training
    # events: every metric of docs/nodes.md, with steps; epoch metrics once per epoch
    for name in ("train_loss", "val_loss", "val_accuracy", "val_loss_step"):
        points = run.metrics(name)
        assert len(points) == 15, name
        assert [p["epoch"] for p in points] == list(range(1, 16))
    assert run.metrics("train_loss")[-1]["step"] == metrics["steps"]
    assert run.metrics("train_loss_batch"), "train_loss_batch reported at least at epoch ends"
    progress = run.of("progress")
    assert progress[-1]["value"] == progress[-1]["max"] == metrics["steps"]
    assert run.ctx.execution_facts["strategy"] == "single"
    assert run.ctx.execution_facts["effective_batch_size"] == 64


def test_seeded_training_is_reproducible(digits, loaders, build_mlp, train_node, make_run):
    tl, _ = loaders
    losses = []
    for seed in (5, 5, 6):
        run = make_run(seed=seed)
        with runtime.use(run.ctx):
            _, m = train_node(build_mlp(digits[2], "32", dropout=0.2), tl, epochs=2)
        losses.append(m["train_loss"])
    assert losses[0] == losses[1]
    assert losses[0] != losses[2]


def test_node_seed_used_without_a_run_seed(digits, loaders, build_mlp, train_node):
    tl, _ = loaders
    model = build_mlp(digits[2], "32", dropout=0.3)
    _, a = train_node(model, tl, epochs=1, seed=11)
    _, b = train_node(model, tl, epochs=1, seed=11)
    assert a["train_loss"] == b["train_loss"]


def test_max_steps_stops_mid_epoch_and_validates(digits, loaders, build_mlp, train_node):
    tl, vl = loaders
    _, m = train_node(build_mlp(digits[2]), tl, epochs=50, max_steps=30, val_dataloader=vl)
    assert m["steps"] == 30 and m["epochs_completed"] == 1  # 23 batches per epoch: epoch 2 is partial
    assert len(m["train_loss"]) == 2 and m["val_loss_step"][-1][0] == 30


def test_gradient_accumulation_equals_a_bigger_batch(digits, build_mlp, train_node):
    train_ds = digits[0]
    (big,) = N["XPUDataLoader"]().make(train_ds, 64, False)
    (small,) = N["XPUDataLoader"]().make(train_ds, 32, False)
    model = build_mlp(digits[2], "32")
    a, ma = train_node(model, big, optimizer="sgd", lr=0.1, epochs=2)
    b, mb = train_node(model, small, optimizer="sgd", lr=0.1, epochs=2, accumulate_steps=2)
    assert ma["steps"] == mb["steps"] == 2 * math.ceil(len(train_ds) / 64)
    assert mb["effective_batch_size"] == 64
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.allclose(va, vb, atol=1e-5), k


def test_grad_clip_bounds_the_update(digits, loaders, build_mlp, train_node):
    tl, _ = loaders
    model = build_mlp(digits[2], "32")
    trained, _ = train_node(model, tl, optimizer="sgd", lr=1.0, epochs=1, max_steps=1, grad_clip_norm=0.01)
    delta = torch.sqrt(sum(((p1 - p0) ** 2).sum() for p0, p1 in zip(model.parameters(), trained.parameters(),
                                                                   strict=True)))
    assert 0 < float(delta.detach()) <= 0.01 + 1e-6
    free, _ = train_node(model, tl, optimizer="sgd", lr=1.0, epochs=1, max_steps=1)
    free_delta = torch.sqrt(sum(((p1 - p0) ** 2).sum() for p0, p1 in zip(model.parameters(), free.parameters(),
                                                                        strict=True)))
    assert float(free_delta.detach()) > 0.05


def test_bf16_autocast_trains_on_cpu(digits, loaders, build_mlp, train_node):
    tl, vl = loaders
    _, m = train_node(build_mlp(digits[2]), tl, epochs=8, precision="bf16", val_dataloader=vl)
    assert m["precision"] == "bf16"
    assert m["final_val_accuracy"] >= 0.85


def test_fp16_on_cpu_falls_back_with_a_warning(digits, loaders, build_mlp, train_node, make_run):
    tl, _ = loaders
    run = make_run()
    with runtime.use(run.ctx):
        _, m = train_node(build_mlp(digits[2]), tl, epochs=1, precision="fp16")
    assert m["precision"] == "bf16"
    (w,) = run.warnings("precision_fallback")
    assert "fp16 autocast is not supported on the CPU" in w["message"]


def test_checkpoints_every_epochs_and_steps(digits, loaders, build_mlp, train_node, make_run, tmp_path):
    tl, _ = loaders
    run = make_run()
    with runtime.use(run.ctx):
        trained, m = train_node(build_mlp(digits[2]), tl, epochs=4, checkpoint_every=2, checkpoint_every_steps=40)
    ckdir = tmp_path / "run" / "checkpoints"
    names = sorted(p.name for p in ckdir.iterdir())
    assert names == ["epoch_0002.pt", "epoch_0004.pt", "step_00000040.pt", "step_00000080.pt"]
    assert not [p for p in ckdir.iterdir() if p.name.startswith(".")]  # no temp files left
    last = load_checkpoint(ckdir / "epoch_0004.pt")
    assert last["epoch"] == 4 and last["step"] == 4 * len(tl) and last["reason"] == "epoch"
    assert all(torch.equal(v, trained.state_dict()[k]) for k, v in last["model"].items())
    assert last["xpu_spec"]["builder"] == "mlp" and len(last["train_loss"]) == 4
    assert {a["path"] for a in run.of("artifact") if a["kind"] == "checkpoint"} == {str(ckdir / n) for n in names}
    assert m["checkpoints"] == [str(ckdir / n) for n in
                                ["step_00000040.pt", "epoch_0002.pt", "step_00000080.pt", "epoch_0004.pt"]]


def test_stop_writes_the_interrupt_checkpoint_and_resume_continues(digits, loaders, build_mlp, train_node,
                                                                   make_run, tmp_path, monkeypatch):
    tl, _ = loaders
    stop = threading.Event()
    run = make_run(stop_event=stop)
    emit = run.ctx.emit

    def emit_and_stop(type_, payload):
        emit(type_, payload)
        if type_ == "metric" and payload["name"] == "train_loss":  # end of epoch 1: stop during epoch 2
            stop.set()

    run.ctx.emit = emit_and_stop
    model = build_mlp(digits[2])
    with runtime.use(run.ctx), pytest.raises(runtime.RunStopped, match="stopped at epoch 2, batch 1"):
        train_node(model, tl, epochs=5)
    path = tmp_path / "run" / "checkpoints" / "interrupt.pt"
    state = load_checkpoint(path)
    assert state["reason"] == "interrupt" and state["epoch"] == 1 and state["step"] == len(tl) + 1
    assert not state["epoch_complete"]
    assert any(a["kind"] == "checkpoint" and a["reason"] == "interrupt" for a in run.of("artifact"))
    # resume: the interrupted epoch restarts, the optimizer step count carries on (outside the run, its
    # folder is readable as a data root: nodes/paths.py)
    monkeypatch.setenv("XPUFLEET_DATA_ROOTS", str(tmp_path / "run"))
    _, m = train_node(model, tl, epochs=3, resume_from=str(path))
    assert m["epochs_completed"] == 3
    assert m["steps"] == len(tl) + 1 + 2 * len(tl)
    assert len(m["train_loss"]) == 3  # epoch 1 from the checkpoint, epochs 2 and 3 trained now


def test_stop_from_comfyui_interrupt_flag(comfy_host, digits, loaders, build_mlp, train_node, tmp_path,
                                          monkeypatch):
    _instance, _load = comfy_host
    import comfy.model_management as mm

    monkeypatch.setattr(mm, "interrupt_processing", True)
    tl, _ = loaders
    # ComfyUI's own exception, so its executor reports the prompt as interrupted rather than failed
    with pytest.raises(mm.InterruptProcessingException, match="epoch 1, batch 1"):
        train_node(build_mlp(digits[2]), tl, epochs=2, checkpoint_dir="ck")
    # outside a run, a checkpoint_dir is a folder inside the outputs folder (ComfyUI's output/xpufleet)
    assert (tmp_path / "comfy" / "output" / "xpufleet" / "ck" / "interrupt.pt").is_file()
    assert mm.interrupt_processing is False  # cleared, as ComfyUI clears it when it raises
    # our own runs keep RunStopped even when ComfyUI's modules are loaded
    mm.interrupt_processing = False
    run = runtime.RunContext(emit=lambda t, p: None, run_dir=tmp_path / "run")
    run.stop_event.set()
    with runtime.use(run), pytest.raises(runtime.RunStopped):
        train_node(build_mlp(digits[2]), tl, epochs=2, checkpoint_dir="ck2")
    assert (tmp_path / "run" / "ck2" / "interrupt.pt").is_file()  # inside a run: inside its run dir


def test_lr_schedulers(digits, loaders, build_mlp):
    tl, _ = loaders
    model = build_mlp(digits[2], "16")
    loss = LossSpec()

    def lrs(spec: SchedulerSpec, epochs: int = 4) -> list[float]:
        (_, m) = N["XPUTrainingLoop"]().train(model, tl, OptimizerSpec("sgd", 0.1), loss, epochs=epochs,
                                               device="cpu", lr_scheduler=spec, tensorboard=False)["result"]
        return [lr for _, lr in m["lr"]]

    step = lrs(SchedulerSpec("step", step_size=2, gamma=0.5))
    assert step[0] == pytest.approx(0.1) and step[-1] == pytest.approx(0.05)  # epochs 3-4 run at 0.1 * 0.5
    one = lrs(SchedulerSpec("onecycle", max_lr=1.0, pct_start=0.3), epochs=2)
    assert max(one) <= 1.0 and one[-1] < 0.01  # annealed to the end without stepping past total_steps
    cos = lrs(SchedulerSpec("cosine", interval="step", eta_min=0.001), epochs=2)
    assert cos[-1] == pytest.approx(0.001, abs=1e-6)
    with pytest.raises(ValueError, match="unknown LR scheduler"):
        SchedulerSpec("warmup")


def test_regression_with_mse_has_no_accuracy(build_mlp, train_node):
    train_ds, val_ds, info = N["XPUDataset"]().load("diabetes")
    (tl,) = N["XPUDataLoader"]().make(train_ds, 32, True)
    (vl,) = N["XPUDataLoader"]().make(val_ds, 128, False)
    _, m = train_node(build_mlp(info, "32"), tl, loss="mse", lr=0.05, epochs=15, val_dataloader=vl)
    assert m["val_accuracy"] == [] and m["final_val_accuracy"] is None
    assert m["final_val_loss"] < m["val_loss"][0] / 3


def test_binary_classification_with_bce_and_one_output(build_mlp, train_node):
    train_ds, val_ds, info = N["XPUDataset"]().load("breast_cancer")
    (tl,) = N["XPUDataLoader"]().make(train_ds, 32, True)
    (vl,) = N["XPUDataLoader"]().make(val_ds, 128, False)
    model = build_mlp(info, "16", out_features=1)
    _, m = train_node(model, tl, loss="bce_with_logits", epochs=10, val_dataloader=vl)
    assert m["final_val_accuracy"] >= 0.9


def test_tensorboard_event_files(digits, loaders, build_mlp, train_node, make_run, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    tl, vl = loaders
    run = make_run()
    with runtime.use(run.ctx):
        _, m = train_node(build_mlp(digits[2]), tl, epochs=3, val_dataloader=vl, tensorboard=True)
    tb = tmp_path / "run" / "tensorboard"
    assert m["tensorboard_dir"] == str(tb)
    acc = EventAccumulator(str(tb))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"train_loss", "val_loss", "val_accuracy", "val_loss_step", "train_loss_batch"} <= tags
    assert [round(e.value, 5) for e in acc.Scalars("train_loss")] == [round(v, 5) for v in m["train_loss"]]


def test_ddp_falls_back_with_the_reason(digits, loaders, build_mlp, train_node, make_run):
    tl, _ = loaders
    cases = [
        ({"placement": "canvas"}, "the canvas Run executes in the ComfyUI process"),
        ({"placement": "local", "devices": ["cuda:0", "cuda:1"]}, "runs on this server (target local)"),
        ({"placement": "worker", "devices": ["cuda:0"]}, "this run on a worker has 1 card (cuda:0)"),
    ]
    for fields, reason in cases:
        # simulated cards (docs/architecture.md): scheduled as CUDA cards, computed on the CPU
        run = make_run(execution_facts={"simulated_devices": True}, **fields)
        with runtime.use(run.ctx):
            _, m = train_node(build_mlp(digits[2], "16"), tl, epochs=1, strategy="ddp", device="auto")
        (w,) = run.warnings("ddp_not_available")
        assert reason in w["message"]
        assert "ddp needs a queued run on a worker with two or more cards" in w["message"]
        assert m["strategy"] == "single" and m["world_size"] == 1
    run = make_run()
    with runtime.use(run.ctx):
        train_node(build_mlp(digits[2], "16"), tl, epochs=1, strategy="single")
    assert run.warnings("ddp_not_available") == []


def test_device_fallback_warning_for_a_missing_card(digits, loaders, build_mlp, train_node, make_run):
    tl, _ = loaders
    run = make_run(devices=["cpu"])
    with runtime.use(run.ctx):
        _, m = train_node(build_mlp(digits[2], "16"), tl, epochs=1, device="cuda:1")
    assert m["device"] == "cpu"
    assert "is set to device cuda:1" in run.warnings("device_fallback")[0]["message"]


def test_training_loop_rejects_bad_inputs(digits, loaders, build_mlp, train_node):
    tl, _ = loaders
    model = build_mlp(digits[2], "16")
    with pytest.raises(ValueError, match="epochs must be >= 1"):
        train_node(model, tl, epochs=0)
    with pytest.raises(ValueError, match="'optimizer' must come from an Optimizer node"):
        N["XPUTrainingLoop"]().train(model, tl, "adam", LossSpec(), epochs=1)
    (empty,) = N["XPUDataLoader"]().make(digits[0], 5000, False, 0, True)
    with pytest.raises(ValueError, match="yields no batches"):
        train_node(model, empty, epochs=1)
    with pytest.raises(ValueError, match=r"loss cross_entropy: model outputs \[64, 10\] vs targets \[64, 1\]"):
        reg = N["XPUDataset"]().load("synthetic_regression", n_samples=200, n_features=64)[0]
        (rl,) = N["XPUDataLoader"]().make(reg, 64, False)
        train_node(model, rl, epochs=1)
    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):
            yield from zip(digits[0].x, digits[0].y, strict=True)

    (stream,) = N["XPUDataLoader"]().make(Stream(), 32, False)
    with pytest.raises(ValueError, match="needs a DataLoader over a map-style dataset"):
        train_node(model, stream, epochs=1)
    with pytest.raises(ValueError, match="precision must be one of"):
        train_node(model, tl, epochs=1, precision="fp8")
    with pytest.raises(ValueError, match="unknown optimizer"):
        N["XPUOptimizer"]().make("lion")


@pytest.mark.parametrize("name", ["sgd", "sgd_momentum", "adam", "adamw", "rmsprop"])
def test_every_optimizer_learns(name, digits, loaders, build_mlp, train_node):
    tl, vl = loaders
    lr = {"sgd": 0.1, "sgd_momentum": 0.05, "rmsprop": 1e-3}.get(name, 2e-3)
    _, m = train_node(build_mlp(digits[2], "32"), tl, optimizer=name, lr=lr, epochs=4, val_dataloader=vl)
    assert m["final_val_accuracy"] > 0.8, (name, m["val_accuracy"])


def test_optimizer_spec_builds_the_torch_optimizer():
    p = [torch.nn.Parameter(torch.zeros(2))]
    opt = OptimizerSpec("sgd_momentum", 0.1, weight_decay=0.01, momentum=0.8, nesterov=True).build(p)
    assert isinstance(opt, torch.optim.SGD)
    assert opt.defaults["momentum"] == 0.8 and opt.defaults["nesterov"] and opt.defaults["weight_decay"] == 0.01
    assert isinstance(OptimizerSpec("adamw", 1e-3).build(p), torch.optim.AdamW)
    assert OptimizerSpec("sgd", 0.1).build(p).defaults["momentum"] == 0


def test_a_chosen_momentum_of_zero_stays_zero():
    p = [torch.nn.Parameter(torch.zeros(2))]
    assert OptimizerSpec("sgd_momentum", 0.1, momentum=0.0).build(p).defaults["momentum"] == 0.0


def test_nesterov_without_momentum_is_refused_before_the_run():
    with pytest.raises(ValueError, match="nesterov needs a momentum above 0"):
        OptimizerSpec("sgd_momentum", 0.1, momentum=0.0, nesterov=True)


def test_evaluate_node_is_an_output_node(digits, loaders, build_mlp, train_node):
    tl, vl = loaders
    trained, m = train_node(build_mlp(digits[2]), tl, epochs=5, val_dataloader=vl)
    out = N["XPUEvaluate"]().evaluate(trained, vl, "cpu", "fp32")
    (metrics,) = out["result"]
    assert metrics["accuracy"] == pytest.approx(m["final_val_accuracy"])
    assert metrics["loss"] == pytest.approx(m["final_val_loss"])
    assert metrics["n_samples"] == len(digits[1]) and metrics["loss_name"] == "cross_entropy"
    assert "accuracy" in out["ui"]["text"][0]
    # a hand count agrees with the node
    with torch.no_grad():
        hand = (trained(digits[1].x).argmax(1) == digits[1].y).double().mean().item()
    assert metrics["accuracy"] == pytest.approx(hand)


def test_plain_python_stop_is_checked_at_reports(digits, loaders, build_mlp, monkeypatch, xpufleet_home):
    from xpufleet.nodes import trainer

    assert runtime.current() is None and trainer.stop_checker() is trainer._never
    calls = []

    def stop_now() -> bool:
        calls.append(1)
        return True

    monkeypatch.setattr(runtime, "should_stop", stop_now)
    tl, _ = loaders
    cfg = trainer.TrainConfig(epochs=3, device="cpu", tensorboard=False, progress_interval_s=0.0,
                              checkpoint_dir="ck")
    with pytest.raises(runtime.RunStopped, match="epoch 1, batch 1"):
        trainer.train(build_mlp(digits[2]), tl, OptimizerSpec(), LossSpec(), cfg)
    assert calls == [1] and (xpufleet_home / "outputs" / "ck" / "interrupt.pt").is_file()


def test_deterministic_runs_train_in_torchs_strict_mode_and_restore_it(digits, loaders, build_mlp, train_node,
                                                                         tmp_path, monkeypatch):
    tl, _ = loaders
    seen: list[tuple[bool, bool]] = []
    real = torch.use_deterministic_algorithms

    def spy(mode, *, warn_only=False):
        seen.append((mode, warn_only))
        real(mode, warn_only=warn_only)

    monkeypatch.setattr(torch, "use_deterministic_algorithms", spy)
    run = runtime.RunContext(emit=lambda t, p: None, run_dir=tmp_path / "run", deterministic=True)
    with runtime.use(run):
        train_node(build_mlp(digits[2], "16"), tl, epochs=1)
    assert seen == [(True, False), (False, False)]  # strict while training (no warn_only), then put back
    assert not torch.are_deterministic_algorithms_enabled()
