"""The run's event sink: numbered JSON lines to both sinks, and readable milestones for output.log."""

from __future__ import annotations

import io
import json

from xpufleet.server.run.events import EventSink, console_line


def test_sink_numbers_events_and_writes_readable_milestones(tmp_path):
    pipe, console = io.BytesIO(), io.StringIO()
    sink = EventSink(pipe, tmp_path / "events.jsonl", console=console)
    sink.emit("run_started", {"run_id": "r1", "devices": ["cuda:0"]})
    sink.emit("node_started", {"node": "7", "class_type": "XPUTrainingLoop"})
    sink.emit("progress", {"node": "7", "value": 1, "max": 10})
    sink.emit("metric", {"name": "train_loss", "value": 0.5, "epoch": 1})
    sink.emit("node_error", {"node": "7", "class_type": "XPUTrainingLoop", "message": "boom"})
    sink.emit("run_finished", {"status": "failed", "error": "boom"})
    pipe_bytes = pipe.getvalue()
    sink.close()
    lines = [json.loads(x) for x in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["seq"] for e in lines] == [1, 2, 3, 4, 5, 6]
    assert pipe_bytes.decode().splitlines() == (tmp_path / "events.jsonl").read_text().splitlines()
    assert console.getvalue().splitlines() == [
        "[xpufleet] run r1 started on cuda:0",
        "[xpufleet] node 7 (XPUTrainingLoop) started",
        "[xpufleet] train_loss epoch 1 = 0.5",
        "[xpufleet] node 7 (XPUTrainingLoop) failed: boom",
        "[xpufleet] run failed: boom",
    ]  # progress stays out of the log
    assert sink.final_metrics == {"train_loss": 0.5} and sink.node_errors == {"7"}


def test_console_line_skips_what_is_not_a_milestone():
    assert console_line("progress", {"node": "1"}) is None
    assert console_line("memory_sample", {}) is None
    assert console_line("run_finished", {"status": "succeeded", "error": None}) == "run succeeded"
