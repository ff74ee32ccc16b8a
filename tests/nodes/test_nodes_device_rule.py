"""The node `device` parameter rule (docs/nodes.md, docs/sidecar.md): auto follows the run, fallbacks warn as the seed words."""

from __future__ import annotations

import pytest

from xpufleet.nodes import device, runtime


def run_ctx(devices, aliases=None, placement="worker", simulated=False):
    events = []
    ctx = runtime.RunContext(
        emit=lambda t, p: events.append((t, p)),
        devices=devices,
        device_aliases=aliases or {},
        placement=placement,
        execution_facts={"simulated_devices": simulated},
    )
    ctx.node_id, ctx.class_type = "train", "TrainingLoop"
    return ctx, events


def test_auto_follows_the_runs_first_card():
    ctx, events = run_ctx(["cuda:0", "cuda:1"], {"cuda:0": "cuda:2", "cuda:1": "cuda:0"})
    with runtime.use(ctx):
        assert device.choose_device("auto") == "cuda:0"
        assert device.choose_device("cuda:1") == "cuda:1"
        assert device.choose_device("cuda") == "cuda:0"
        assert device.choose_device("cpu") == "cpu"
    assert events == []


def test_fallback_message_is_the_seeds():
    ctx, events = run_ctx(["cuda:0"], {"cuda:0": "cuda:1"})
    with runtime.use(ctx):
        assert device.choose_device("cuda:1") == "cuda:0"
    (type_, payload), = events
    assert type_ == "run_warning" and payload["kind"] == "device_fallback"
    assert payload["message"] == (
        "Node train (TrainingLoop) is set to device cuda:1; this run has 1 card "
        "(cuda:0 = the worker's cuda:1), so when it executes, it runs on cuda:0."
    )


def test_local_run_without_the_card_falls_back_to_cpu():
    ctx, events = run_ctx(["cpu"], placement="local")
    with runtime.use(ctx):
        assert device.choose_device("xpu:0") == "cpu"
    assert "this run has 1 card (cpu)" in events[0][1]["message"]


def test_simulated_cards_run_on_the_cpu():
    import torch

    ctx, _ = run_ctx(["cuda:0", "cuda:1"], simulated=True)
    with runtime.use(ctx):
        assert device.torch_device("cuda:1") == torch.device("cpu")


def test_no_context_uses_this_machine():
    assert device.choose_device("auto") in device.available_devices()
    assert device.choose_device("cuda:7") in ("cpu", "cuda:7")


@pytest.mark.parametrize("bad", ["gpu", "cuda:x", "cpu:1", "", "tpu:0"])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError, match="use auto, cpu, cuda"):
        device.parse_device(bad)
