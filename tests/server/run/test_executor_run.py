"""Execution: events, the run context, failures naming the node, cooperative stop, progress adapter."""

from __future__ import annotations

import threading

import pytest

from xpufleet.nodes import runtime
from xpufleet.server.run.executor import NodeExecutionError, execute_graph


class Counter:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"steps": ("INT", {"default": 3, "min": 1, "max": 100})}}

    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "run"
    OUTPUT_NODE = True

    def run(self, steps):
        for i in range(steps):
            if runtime.should_stop():
                raise runtime.RunStopped("stopped in Counter")
            runtime.progress(i + 1, steps, "counting")
            runtime.metric("count", i, step=i)
        return (steps,)


class Boom:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"x": ("NUMBER",)}}

    RETURN_TYPES = ()
    FUNCTION = "run"
    OUTPUT_NODE = True

    def run(self, x):
        raise ValueError(f"cannot handle {x}")


class StopsRun:
    """Sets the stop flag the way a cancel request would, from another thread."""

    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {}}

    RETURN_TYPES = ("NUMBER",)
    FUNCTION = "run"

    def run(self):
        ctx = runtime.current()
        t = threading.Thread(target=ctx.stop_event.set)
        t.start()
        t.join()
        return (1,)


CLASSES = {"Counter": Counter, "Boom": Boom, "StopsRun": StopsRun}


def make_ctx():
    events: list[tuple[str, dict]] = []
    ctx = runtime.RunContext(emit=lambda t, p: events.append((t, p)))
    return ctx, events


def test_events_carry_node_and_progress():
    ctx, events = make_ctx()
    out = execute_graph({"1": {"class_type": "Counter", "inputs": {"steps": 3}}}, ctx, CLASSES)
    assert out.outputs["1"] == (3,)
    types = [t for t, _ in events]
    assert types[0] == "node_started" and types[-1] == "node_finished"
    progress = [p for t, p in events if t == "progress"]
    assert [p["value"] for p in progress] == [1, 2, 3] and all(p["node"] == "1" for p in progress)
    metrics = [p for t, p in events if t == "metric"]
    assert [m["value"] for m in metrics] == [0.0, 1.0, 2.0] and metrics[0]["class_type"] == "Counter"
    assert runtime.current() is None  # the context does not leak out of the run


def test_node_failure_names_the_node():
    ctx, events = make_ctx()
    graph = {
        "1": {"class_type": "Counter", "inputs": {"steps": 1}},
        "2": {"class_type": "Boom", "inputs": {"x": ["1", 0]}},
    }
    with pytest.raises(NodeExecutionError) as info:
        execute_graph(graph, ctx, CLASSES)
    assert info.value.node_id == "2" and "Node 2 (Boom) failed: ValueError: cannot handle 1" in str(info.value)
    err = [p for t, p in events if t == "node_error"]
    assert err and err[0]["node"] == "2" and "Traceback" in err[0]["traceback"]


def test_cooperative_stop_between_nodes():
    ctx, events = make_ctx()
    graph = {
        "1": {"class_type": "StopsRun", "inputs": {}},
        "2": {"class_type": "Counter", "inputs": {"steps": 5}},
        "3": {"class_type": "Boom", "inputs": {"x": ["1", 0]}},
    }
    with pytest.raises(runtime.RunStopped):
        execute_graph(graph, ctx, CLASSES)
    started = [p["node"] for t, p in events if t == "node_started"]
    assert started == ["1"]


def test_stop_inside_a_node():
    ctx, _ = make_ctx()
    ctx.stop_event.set()
    with pytest.raises(runtime.RunStopped):
        execute_graph({"1": {"class_type": "Counter", "inputs": {"steps": 5}}}, ctx, CLASSES)


def test_hosted_progress_goes_to_comfy_progressbar(comfy_host):
    import comfy.utils

    comfy.utils.UPDATES.clear()
    execute_graph({"1": {"class_type": "Counter", "inputs": {"steps": 4}}}, None, CLASSES)
    assert comfy.utils.UPDATES == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_hosted_interrupt_is_a_stop(comfy_host):
    import comfy.model_management as mm

    mm.interrupt_current_processing(True)
    try:
        with pytest.raises(runtime.RunStopped):
            execute_graph({"1": {"class_type": "Counter", "inputs": {"steps": 2}}}, None, CLASSES)
    finally:
        mm.interrupt_current_processing(False)


def test_console_view_survives_null_and_text_metrics():
    import io

    from xpufleet.server.cli.console import ProgressView

    view = ProgressView(io.StringIO())
    view.handle("metric", {"name": "train_loss", "value": None})
    view.handle("metric", {"name": "odd", "value": "n/a"})
    view.handle("progress", {"value": 1, "max": 2, "loss": None})
    text = view.summary("succeeded")
    assert "train_loss" in text and "nan" in text
