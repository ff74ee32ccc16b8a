"""The plugin's recorder of canvas runs (server/comfy/canvas_runs.py) against a stand-in of ComfyUI's
PromptServer (its prompt queue and history, as execution.PromptQueue keeps them) and a real sidecar app
in this process: what hosted nodes report arrives as one run with source canvas, its end is ComfyUI's
history entry, a cancel on the sidecar interrupts ComfyUI, and with no sidecar nothing is sent."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py
from aiohttp.test_utils import TestClient, TestServer

from xpufleet.common.client import Client
from xpufleet.server.comfy import canvas_runs
from xpufleet.server.comfy.canvas_runs import CanvasRecorder, prompt_end
from xpufleet.server.sidecar.app import SidecarConfig, create_app

CPU = [{"name": "cpu", "kind": "cpu", "uuid": None, "total_gib": None}]
WAIT_S = 60.0


class Queue:
    """execution.PromptQueue's reading side: running items (number, prompt_id, prompt, ...) and history."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.running: list[tuple] = []
        self.history: dict[str, dict[str, Any]] = {}

    def get_current_queue_volatile(self):
        with self.lock:
            return list(self.running), []

    def get_history(self, prompt_id=None, map_function=None):
        with self.lock:
            entry = self.history.get(prompt_id)
            return {} if entry is None else {prompt_id: map_function(entry) if map_function else entry}

    def start(self, number: int, prompt_id: str, prompt: dict[str, Any]) -> None:
        with self.lock:
            self.running.append((number, prompt_id, prompt, {}, []))

    def done(self, prompt_id: str, status_str: str, messages: list) -> None:
        with self.lock:
            self.running = [i for i in self.running if i[1] != prompt_id]
            self.history[prompt_id] = {"status": {"status_str": status_str, "completed": status_str == "success",
                                                  "messages": messages}}


class Server:
    def __init__(self) -> None:
        self.prompt_queue = Queue()
        self.last_prompt_id: str | None = None


def until(check, timeout: float = WAIT_S) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.02)  # the recorder's thread has no signal to await here: a bounded poll
    raise AssertionError("not within the bound")


def with_sidecar(tmp_path, body):
    """``body(recorder, server, client)`` in a thread while an in-process sidecar serves."""
    async def main() -> Any:
        config = SidecarConfig(home=tmp_path / "home", port=0, local_devices=CPU)
        async with TestClient(TestServer(create_app(config), host="127.0.0.1")) as http:
            client = Client(str(http.make_url("")), config.token)
            server = Server()
            recorder = CanvasRecorder(server, flush_s=0.05)
            recorder._client = lambda: client  # the sidecar this test serves (not a runtime file's)
            return await asyncio.to_thread(body, recorder, server, client)

    return asyncio.run(main())


def test_what_hosted_nodes_report_is_one_canvas_run_ended_as_comfyui_says(tmp_path):
    graph = harness.iris_graph(2)

    def body(recorder, server, client):
        server.prompt_queue.start(7, "p-7", graph)
        server.last_prompt_id = "p-7"
        for step in range(50):
            recorder.report("metric", {"node": "6", "name": "train_loss_batch", "value": 1.0 / (step + 1), "step": step})
            recorder.report("progress", {"node": "6", "value": step + 1, "max": 50, "text": ""})
        recorder.report("artifact", {"node": "9", "path": "/out/m.safetensors", "kind": "model"})
        run = until(lambda: (client.runs()["runs"] or [None])[0])
        assert (run["source"], run["status"], run["name"]) == ("canvas", "running", "ComfyUI prompt 7")
        server.prompt_queue.done("p-7", "success", [["execution_start", {}], ["execution_success", {}]])
        ended = until(lambda: client.run(run["id"])["status"] == "succeeded" and client.run(run["id"]))
        assert ended["graph"] == graph and ended["final_metrics"] == {"train_loss_batch": 1.0 / 50}
        events = client.events(run["id"], limit=1000)["events"]
        metrics = [e["payload"]["value"] for e in events if e["type"] == "metric"]
        assert metrics == [1.0 / (s + 1) for s in range(50)]  # every point, in order, once
        progress = [e["payload"]["value"] for e in events if e["type"] == "progress"]
        assert progress[-1] == 50 and len(progress) < 50  # thinned, the last one kept
        assert [e["payload"]["path"] for e in events if e["type"] == "artifact"] == ["/out/m.safetensors"]
        until(lambda: recorder._thread is None)  # nothing open: the sender thread is gone

    with_sidecar(tmp_path, body)


def test_a_cancel_on_the_sidecar_interrupts_comfyuis_prompt(tmp_path, monkeypatch):
    interrupted = threading.Event()
    mm = type("mm", (), {"interrupt_current_processing": staticmethod(lambda value=True: interrupted.set())})
    monkeypatch.setitem(canvas_runs.sys.modules, "comfy.model_management", mm)

    def body(recorder, server, client):
        server.prompt_queue.start(1, "p-1", harness.iris_graph(1))
        server.last_prompt_id = "p-1"
        recorder.report("log", {"node": "6", "message": "epoch 1"})
        run = until(lambda: (client.runs()["runs"] or [None])[0])
        client.cancel(run["id"], "from the Runs panel")
        step = 0
        while not interrupted.is_set() and step < 5000:  # the loop keeps reporting until ComfyUI stops it
            step += 1
            recorder.report("metric", {"node": "6", "name": "train_loss_batch", "value": 1.0, "step": step})
            interrupted.wait(0.01)
        assert interrupted.is_set()
        server.prompt_queue.done("p-1", "error", [["execution_interrupted", {"node_id": "6"}]])
        ended = until(lambda: client.run(run["id"])["status"] == "cancelled" and client.run(run["id"]))
        assert ended["error"] == "cancelled in ComfyUI"

    with_sidecar(tmp_path, body)


def test_with_no_sidecar_nothing_is_sent_and_the_record_is_dropped(tmp_path, monkeypatch):
    monkeypatch.setenv("XPUFLEET_HOME", str(tmp_path / "home"))  # no runtime file there
    server = Server()
    recorder = CanvasRecorder(server, flush_s=0.02)
    sent = []
    monkeypatch.setattr(Client, "request", lambda self, *a, **k: sent.append(a))
    server.prompt_queue.start(1, "p-1", harness.iris_graph(1))
    server.last_prompt_id = "p-1"
    recorder.report("metric", {"node": "6", "name": "train_loss", "value": 1.0})
    server.prompt_queue.done("p-1", "success", [])
    until(lambda: recorder._thread is None)
    assert sent == [] and recorder._records == {}


@pytest.mark.parametrize(("status_str", "messages", "expected"), [
    ("success", [["execution_success", {}]], ("succeeded", None)),
    ("error", [["execution_interrupted", {}]], ("cancelled", "cancelled in ComfyUI")),
    ("error", [["execution_error", {"node_id": "8", "node_type": "XPUTrainingLoop", "exception_message": "boom"}]],
     ("failed", "XPUTrainingLoop (node 8): boom")),
])
def test_the_end_is_comfyuis_history_entry(status_str, messages, expected):
    server = Server()
    server.prompt_queue.start(1, "p", {})
    assert prompt_end(server, "p") is None
    server.prompt_queue.done("p", status_str, messages)
    assert prompt_end(server, "p") == expected
    assert prompt_end(server, "cleared")[0] == "interrupted"


def test_a_prompt_that_ends_before_the_first_send_is_still_recorded_whole(tmp_path):
    graph = harness.iris_graph(1)

    def body(recorder, server, client):
        recorder.flush_s = 0.5
        server.prompt_queue.start(3, "p-3", graph)
        server.last_prompt_id = "p-3"
        recorder.report("metric", {"node": "6", "name": "val_accuracy", "value": 0.9, "epoch": 1})
        server.prompt_queue.done("p-3", "success", [])  # gone from the queue before the sender's first pass
        run = until(lambda: (client.runs()["runs"] or [None])[0])
        ended = until(lambda: client.run(run["id"])["status"] == "succeeded" and client.run(run["id"]))
        assert (ended["name"], ended["graph"], ended["final_metrics"]) == ("ComfyUI prompt 3", graph, {"val_accuracy": 0.9})

    with_sidecar(tmp_path, body)


def test_the_workflow_name_the_page_says_names_the_run_before_or_after_it_is_made(tmp_path):
    def body(recorder, server, client):
        server.prompt_queue.start(4, "p-4", harness.iris_graph(1))
        server.last_prompt_id = "p-4"
        recorder.name_prompt("p-4", "mlp_digits")  # said at execution_start, before the first report
        recorder.report("log", {"node": "6", "message": "epoch 1"})
        run = until(lambda: (client.runs()["runs"] or [None])[0])
        assert run["name"] == "mlp_digits"
        server.prompt_queue.start(5, "p-5", harness.iris_graph(1))
        server.last_prompt_id = "p-5"
        recorder.report("log", {"node": "6", "message": "epoch 1"})
        second = until(lambda: [r for r in client.runs()["runs"] if r["id"] != run["id"]])[0]
        assert second["name"] == "ComfyUI prompt 5"
        recorder.name_prompt("p-5", "cnn_digits")  # said after the run was made: a rename
        until(lambda: client.run(second["id"])["name"] == "cnn_digits")

    with_sidecar(tmp_path, body)


@pytest.mark.parametrize(("body", "message"), [
    ({"prompt_id": "", "name": "x"}, "prompt_id: must be"),
    ({"prompt_id": "p", "name": " "}, "name: must be a workflow name"),
    ({"prompt_id": "p", "name": 3}, "name: must be a workflow name"),
])
def test_a_bad_name_body_is_a_400_naming_the_field(body, message):
    from xpufleet.common.errors import ApiError
    from xpufleet.server.comfy.canvas_runs import parse_name_body

    with pytest.raises(ApiError, match=message) as err:
        parse_name_body(body)
    assert err.value.status == 400
    assert parse_name_body({"prompt_id": "p", "name": " mlp_digits "}) == ("p", "mlp_digits")
