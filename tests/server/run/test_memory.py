"""The run child caps the CUDA allocator to the run's budget (docs/workers.md) and says when it cannot."""

from __future__ import annotations

import pytest

from xpufleet.server.run.memory import GIB, apply_memory_budget, memory_fractions


def test_fraction_is_budget_over_total_capped_at_one():
    assert memory_fractions(6, [24 * GIB, 12 * GIB]) == [0.25, 0.5]
    assert memory_fractions(30, [24 * GIB]) == [1.0]
    with pytest.raises(ValueError, match="budget_gib must be > 0"):
        memory_fractions(0, [24 * GIB])


def test_no_budget_or_no_cuda_card_changes_nothing():
    facts: dict = {}
    apply_memory_budget({"devices": ["cuda:0"]}, facts)
    apply_memory_budget({"devices": ["cpu"], "budget_gib": 4}, facts)
    assert facts == {}


def test_simulated_cards_are_not_pretended_capped():
    facts: dict = {}
    apply_memory_budget({"devices": ["cuda:0", "cuda:1"], "budget_gib": 6, "simulated": True}, facts)
    assert facts["memory_cap"]["applied"] is False and "simulated" in facts["memory_cap"]["reason"]


def test_without_cuda_the_reason_is_recorded():
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA; the cap is applied for real there")
    facts: dict = {}
    apply_memory_budget({"devices": ["cuda:0"], "budget_gib": 6}, facts)
    assert facts["memory_cap"] == {"applied": False, "budget_gib": 6, "reason": "CUDA is not available"}


def test_the_cap_is_applied_per_card_before_the_run(monkeypatch):
    """The branch that runs on a real CUDA worker, with a stand-in of torch.cuda (no GPU here): every
    card of the run gets set_per_process_memory_fraction(budget / its total) before any node runs."""
    import torch

    calls: list[tuple[float, int]] = []
    totals = [24 * GIB, 80 * GIB, 8 * GIB]

    class Props:
        def __init__(self, i: int) -> None:
            self.total_memory = totals[i]

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 3)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: Props(i))
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda f, i: calls.append((f, i)))
    facts: dict = {}
    apply_memory_budget({"devices": ["cuda:0", "cuda:1", "cpu"], "budget_gib": 12}, facts)
    assert calls == [(0.5, 0), (0.15, 1)]  # the run's two cards, not the third the process could see
    assert facts["memory_cap"] == {"applied": True, "budget_gib": 12,
                                   "fractions": {"cuda:0": 0.5, "cuda:1": 0.15}}


def test_a_simulated_card_counts_tensor_bytes_and_caps_them_to_the_budget():
    import torch

    from xpufleet.server.run.memory import is_out_of_memory, peak_memory, simulated_card_memory

    tracker = simulated_card_memory(None, "cuda:2")
    with tracker:
        a = torch.zeros(1024, 1024)  # 4 MiB
        b = a + 1
        del a, b
    assert tracker.peak >= 8 * 1024**2 and tracker.live < tracker.peak
    report = peak_memory(tracker, ["cuda:0"])
    assert report["kind"] == "simulated_tensor_bytes" and report["measured"] is False and report["simulated"] is True
    assert "not a CUDA figure" in report["label"] and report["devices"]["cuda:0"] >= 0.0078
    capped = simulated_card_memory(6 / 1024, "cuda:2")  # 6 MiB
    with pytest.raises(torch.OutOfMemoryError, match="simulated out of memory on cuda:2") as exc, capped:
        keep = [torch.zeros(1024, 1024) for _ in range(2)]
        del keep
    assert is_out_of_memory(exc.value) and not is_out_of_memory(RuntimeError("shape mismatch"))
    assert is_out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))


def test_mps_reports_the_memory_its_driver_holds_labelled_as_such(monkeypatch):
    import types

    fake = types.SimpleNamespace(
        cuda=types.SimpleNamespace(is_available=lambda: False, is_initialized=lambda: False),
        mps=types.SimpleNamespace(driver_allocated_memory=lambda: 3 * GIB),
        backends=types.SimpleNamespace(mps=types.SimpleNamespace(is_available=lambda: True)))
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    from xpufleet.server.run.memory import peak_memory

    report = peak_memory()
    assert report["kind"] == "mps_driver_allocated" and report["devices"] == {"mps:0": 3.0}
    assert "MPS has no peak counter" in report["label"]


def test_a_cuda_peak_reports_the_allocated_and_the_reserved_high_water_marks(monkeypatch):
    import types

    allocated, reserved = {0: 3 * GIB, 1: 0}, {0: 4 * GIB, 1: 0}
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        is_available=lambda: True, is_initialized=lambda: True, device_count=lambda: 2,
        max_memory_allocated=lambda i: allocated[i], max_memory_reserved=lambda i: reserved[i]))
    monkeypatch.setitem(__import__("sys").modules, "torch", fake)
    from xpufleet.server.run.memory import peak_memory

    report = peak_memory()
    assert report["kind"] == "cuda_max_memory_allocated" and report["measured"] is True
    assert report["devices"] == {"cuda:0": 3.0} and report["reserved"] == {"cuda:0": 4.0}  # unused cuda:1 left out


def test_a_run_on_a_simulated_card_over_its_budget_fails_with_the_out_of_memory_facts(tmp_path):
    import json
    import os

    import sidecar_harness as harness

    from xpufleet.server.run import runner

    g = harness.iris_graph(1)
    g["4"]["inputs"]["hidden"] = "1024,1024"
    spec = {"run_id": "r1", "graph": g, "options": {}, "devices": ["cuda:0"], "device_aliases": {"cuda:0": "cuda:3"},
            "placement": "worker", "simulated": True, "env": {}, "budget_gib": 0.01,
            "execution_facts": {"simulated_devices": True}}
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    read_fd, write_fd = os.pipe()  # stdin stays open: the parent is there
    try:
        assert runner.run(tmp_path, stdin=os.fdopen(read_fd)) == 1
    finally:
        os.close(write_fd)
    last = json.loads((tmp_path / "events.jsonl").read_text().splitlines()[-1])
    assert last["type"] == "run_finished"
    payload = last["payload"]
    assert payload["status"] == "failed" and "simulated out of memory on cuda:3" in payload["error"]
    assert payload["out_of_memory"] == {"device": "cuda:3", "budget_gib": 0.01, "simulated": True}
    assert payload["execution_facts"]["simulated_cap"]["budget_gib"] == 0.01
    assert payload["peak_memory"]["kind"] == "simulated_tensor_bytes"


def _metered_run(graph_name: str, tmp_path, monkeypatch, full_steps: int) -> tuple[int, list[bool]]:
    """One run of a sample graph on a simulated card's meter: (its peak, what each pause answered)."""
    import json
    from pathlib import Path

    from xpufleet.nodes import runtime, trainer
    from xpufleet.server.run.executor import execute_graph
    from xpufleet.server.run.memory import simulated_card_memory

    graph = json.loads((Path(__file__).parents[3] / "samples" / f"{graph_name}.json").read_text())
    for node in graph.values():  # two epochs: paused in the first, resumed and paused for the validations
        if node["class_type"] == "XPUTrainingLoop":
            node["inputs"].update(epochs=2, tensorboard=False)
        if node["class_type"] == "XPUModelSaver":
            node["inputs"]["location"] = "run_dir"
    monkeypatch.setattr(trainer, "MEMORY_METER_FULL_STEPS", full_steps)
    meter = simulated_card_memory(None, "cuda:0")
    answers: list[bool] = []
    pause = meter.pause
    monkeypatch.setattr(meter, "pause", lambda: answers.append(pause()) or answers[-1])
    ctx = runtime.RunContext(emit=lambda *_: None, run_dir=tmp_path / full_steps.__str__(), seed=3,
                             memory_meter=meter)
    ctx.run_dir.mkdir()
    with runtime.use(ctx), meter:
        execute_graph(graph, ctx)
    assert not meter.paused
    return meter.peak, answers


@pytest.mark.parametrize("graph_name", ["mlp_digits", "cnn_digits"])
def test_the_paused_meter_reports_the_peak_of_the_meter_that_counts_every_step(graph_name, tmp_path, monkeypatch):
    # The meter steps aside after the loop's first 2 optimizer steps and its first validation
    # (nodes/trainer.py); what follows repeats their allocations, so the peak is the full meter's.
    paused_peak, answers = _metered_run(graph_name, tmp_path, monkeypatch, 2)
    full_peak, never = _metered_run(graph_name, tmp_path, monkeypatch, 10**9)
    assert answers and all(answers), answers  # it did pause (each epoch)
    assert never == []
    assert paused_peak == full_peak, (paused_peak, full_peak)


def test_a_meter_that_is_not_innermost_stays_on_and_a_failure_while_paused_leaves_the_stack_clean():
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

    from xpufleet.server.run.memory import simulated_card_memory

    class Above(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    meter = simulated_card_memory(None, "cuda:0")
    with meter, Above():
        assert meter.pause() is False and not meter.paused  # another mode is above it: it keeps counting
    with pytest.raises(RuntimeError, match="boom"), meter:
        keep = torch.zeros(256, 256)
        assert meter.pause() is True and _get_current_dispatch_mode() is None
        untracked = torch.zeros(512, 512)  # noqa: F841 - made while paused: not counted
        assert meter.live == keep.untyped_storage().nbytes()
        raise RuntimeError("boom")
    assert _get_current_dispatch_mode() is None and not meter.paused
    meter2 = simulated_card_memory(None, "cuda:0")
    with meter2:
        assert meter2.pause()
        kept = torch.ones(128, 128)
        meter2.resume([kept, "not a tensor"])
        assert meter2.live == kept.untyped_storage().nbytes() and _get_current_dispatch_mode() is meter2
