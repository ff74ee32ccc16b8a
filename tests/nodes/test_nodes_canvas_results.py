"""Results on ComfyUI's canvas from the node side: the TrainingLoop's curve in its ui output (thinned),
and the live metric points a hosted node sends to the browser that queued the prompt (nodes/runtime.py)."""

from __future__ import annotations

import math
import sys
import types

import pytest

from xpufleet.constants import CANVAS_METRIC_EVENT
from xpufleet.nodes import runtime
from xpufleet.nodes.training import ui_curve


def test_the_curve_is_thinned_to_the_limit_keeping_first_and_last_and_drops_non_finite_points():
    metrics = {"train_loss_batch": [[s, 1.0 / (s + 1)] for s in range(1000)],
               "val_loss_step": [[10, 0.5], [20, math.nan], [30, 0.25]]}
    curve = ui_curve(metrics, points=50)
    assert len(curve["train_loss_batch"]) == 50
    assert curve["train_loss_batch"][0] == [0, 1.0] and curve["train_loss_batch"][-1] == [999, 1.0 / 1000]
    assert curve["val_loss_step"] == [[10, 0.5], [30, 0.25]]
    assert ui_curve({}) == {"train_loss_batch": [], "val_loss_step": []}


class FakePromptServer:
    def __init__(self) -> None:
        self.sent: list[tuple] = []
        self.client_id = "browser-1"
        self.last_prompt_id = "prompt-7"

    def send_sync(self, event, data, sid=None) -> None:
        self.sent.append((event, data, sid))


@pytest.fixture
def hosted(monkeypatch):
    """ComfyUI's server module with a PromptServer instance, executing node 8."""
    fake = FakePromptServer()
    module = types.ModuleType("server")
    module.PromptServer = types.SimpleNamespace(instance=fake)
    monkeypatch.setitem(sys.modules, "server", module)
    monkeypatch.setattr(runtime, "hosted_node_id", lambda: "8")
    return fake


def test_a_hosted_metric_goes_to_the_browser_that_queued_the_prompt(hosted):
    runtime.metric("train_loss_batch", 0.5, step=3, epoch=1)
    assert hosted.sent == [(CANVAS_METRIC_EVENT, {"node": "8", "prompt_id": "prompt-7", "name": "train_loss_batch",
                                                  "value": 0.5, "step": 3, "epoch": 1}, "browser-1")]


def test_a_non_finite_metric_is_not_sent_and_a_failing_send_does_not_stop_training(hosted, monkeypatch):
    runtime.metric("train_loss", math.inf, step=1)
    assert hosted.sent == []
    monkeypatch.setattr(hosted, "send_sync", lambda *a: (_ for _ in ()).throw(RuntimeError("socket gone")))
    runtime.metric("train_loss", 0.1, step=2)  # no exception: the chart is a view


def test_inside_a_run_of_ours_the_metric_is_a_run_event_and_nothing_goes_to_comfyui(hosted):
    events = []
    with runtime.use(runtime.RunContext(emit=lambda t, p: events.append((t, p)))):
        runtime.metric("val_loss", 0.2, step=5)
    assert events == [("metric", {"name": "val_loss", "value": 0.2, "step": 5})] and hosted.sent == []


def test_outside_comfyui_nothing_is_sent_and_nothing_errs(monkeypatch):
    monkeypatch.delitem(sys.modules, "server", raising=False)
    runtime.metric("train_loss", 0.3, step=1)  # plain Python (xpufleet run's children have a context)
    assert "server" not in sys.modules
