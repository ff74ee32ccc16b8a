"""The run side of a ComfyUI run (server/run/comfy_client.py) against a scripted stand-in of ComfyUI's HTTP
and websocket API in this process: the events, the recorded outputs, ComfyUI's refusal, a node error, an
OOM, a stop, and an instance that dies mid-run."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from xpufleet.server.run.comfy_client import ComfyRun, file_kind, output_files, run_comfy

PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 32
GRAPH = {"1": {"class_type": "EmptyImage", "inputs": {}}, "3": {"class_type": "KSampler", "inputs": {}},
         "9": {"class_type": "SaveImage", "inputs": {"images": ["1", 0]}}}


class FakeComfy:
    """Answers /prompt with ``prompt_answer`` and then plays ``script`` (messages; ``"close"`` closes the
    socket; ``"wait_interrupt"`` waits for POST /interrupt, then says execution_interrupted)."""

    def __init__(self, script: list[Any], prompt_status: int = 200, prompt_answer: Any = None) -> None:
        self.script = script
        self.prompt_status = prompt_status
        self.prompt_answer = prompt_answer or {"prompt_id": "p1", "number": 0, "node_errors": {}}
        self.ws: web.WebSocketResponse | None = None
        self.prompts: list[dict[str, Any]] = []
        self.interrupts: list[Any] = []
        self.deleted: list[Any] = []
        self.interrupted = asyncio.Event()
        self.connected = asyncio.Event()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/ws", self.on_ws)
        app.router.add_post("/prompt", self.on_prompt)
        app.router.add_get("/view", self.on_view)
        app.router.add_post("/interrupt", self.on_interrupt)
        app.router.add_post("/queue", self.on_queue)
        return app

    async def on_ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        self.ws = ws
        self.client_id = request.query.get("clientId")
        self.connected.set()
        await ws.send_json({"type": "status", "data": {"status": {"exec_info": {"queue_remaining": 0}}}})
        async for _ in ws:
            pass
        return ws

    async def on_prompt(self, request: web.Request) -> web.Response:
        self.prompts.append(await request.json())
        if self.prompt_status == 200:
            asyncio.get_running_loop().create_task(self.play())
        return web.json_response(self.prompt_answer, status=self.prompt_status)

    async def play(self) -> None:
        await self.connected.wait()
        assert self.ws is not None
        for item in self.script:
            if item == "close":
                await self.ws.close()
                return
            if item == "wait_interrupt":
                await asyncio.wait_for(self.interrupted.wait(), 10)
                item = {"type": "execution_interrupted", "data": {"prompt_id": "p1", "node_id": "3"}}
            if isinstance(item, bytes):
                await self.ws.send_bytes(item)
            else:
                await self.ws.send_json(item)
            await asyncio.sleep(0.01)

    async def on_view(self, request: web.Request) -> web.Response:
        if request.query.get("filename") == "missing.png":
            return web.Response(status=404)
        return web.Response(body=PNG, content_type="image/png")

    async def on_interrupt(self, request: web.Request) -> web.Response:
        self.interrupts.append(await request.json())
        self.interrupted.set()
        return web.Response()

    async def on_queue(self, request: web.Request) -> web.Response:
        self.deleted.append(await request.json())
        return web.Response()


def stopped(reason: str | None) -> Any:
    """The runner's outcome of a stop (run/runner.py ``_stopped``) for ``reason``."""
    from xpufleet.server.run.runner import StopWatcher, _stopped

    watcher = StopWatcher(threading.Event(), stream=iter(()))
    watcher.reason = reason
    return lambda: _stopped(watcher)


def msg(mtype: str, **data: Any) -> dict[str, Any]:
    return {"type": mtype, "data": {"prompt_id": "p1", **data}}


async def start(aiohttp_server, fake: FakeComfy, tmp_path: Path, *, stop: bool = False,
                reason: str | None = None) -> tuple[ComfyRun, list[tuple[str, dict[str, Any]]], threading.Event]:
    server = await aiohttp_server(fake.app())
    events: list[tuple[str, dict[str, Any]]] = []
    spec = {"run_id": "r1", "graph": GRAPH, "worker": "box", "budget_gib": 4.0,
            "comfyui": {"url": f"http://127.0.0.1:{server.port}", "instance": "cuda:1", "devices": ["cuda:1"],
                        "log": "/h/comfyui/box/cuda_1/comfyui.log", "started": False, "version": "0.3.64"}}
    stop_event = threading.Event()
    if stop:
        stop_event.set()
    job = ComfyRun(spec, tmp_path, lambda t, p: events.append((t, p)), stop_event, stopped(reason))
    return job, events, stop_event


SUCCESS = [
    msg("execution_start"), msg("execution_cached", nodes=["1"]), msg("executing", node="3"),
    msg("progress", value=5, max=20, node="3"), b"\x00\x00\x00\x01preview",
    {"type": "executing", "data": {"node": "7", "prompt_id": "someone-else"}},
    msg("executing", node="9"),
    msg("executed", node="9", output={"images": [{"filename": "a.png", "subfolder": "", "type": "output"},
                                                 {"filename": "a.png", "subfolder": "x", "type": "output"}],
                                      "text": ["not a file"]}),
    msg("execution_success"),
]


async def test_a_prompt_runs_its_events_come_out_and_its_files_are_recorded(aiohttp_server, tmp_path):
    fake = FakeComfy(SUCCESS)
    job, events, _ = await start(aiohttp_server, fake, tmp_path)
    assert await job.run() == ("succeeded", None, {})
    assert fake.prompts == [{"prompt": GRAPH, "client_id": "r1"}] and fake.client_id == "r1"
    kinds = [t for t, _ in events]
    assert kinds == ["node_started", "progress", "node_started", "comfy_output"]
    assert events[0][1] == {"node": "3", "class_type": "KSampler"}
    assert events[1][1]["text"] == "KSampler (node 3): step 5 of 20" and events[1][1]["class_type"] == "KSampler"
    out = events[3][1]
    assert out["node"] == "9" and [f["file"] for f in out["files"]] == ["a.png", "a_2.png"]
    root = tmp_path / "recorded_outputs"
    manifest = json.loads((root / "9" / "outputs.json").read_text())
    assert manifest["class_type"] == "SaveImage" and manifest["ui"]["text"] == ["not a file"]
    assert manifest["outputs"][1] == {"kind": "image", "name": "images", "index": 1, "file": "a_2.png",
                                      "bytes": len(PNG), "media_type": "image/png"}
    assert (root / "9" / "a.png").read_bytes() == PNG
    index = json.loads((root / "index.json").read_text())
    assert index["kind"] == "comfyui" and index["mode"] == "upload" and index["complete"] is False
    assert index["nodes"][0]["files"] == ["outputs.json", "a.png", "a_2.png"]
    assert job.outputs.finish()["bytes"] == 2 * len(PNG)
    facts = job.facts()["comfyui"]
    assert facts["prompt_id"] == "p1" and facts["cold_start"] is False and facts["queue_to_first_node_s"] >= 0


async def test_a_file_that_cannot_be_copied_is_a_warning(aiohttp_server, tmp_path):
    fake = FakeComfy([msg("execution_start"), msg("executed", node="9", output={
        "images": [{"filename": "missing.png", "subfolder": "", "type": "output"}]}), msg("execution_success")])
    job, events, _ = await start(aiohttp_server, fake, tmp_path)
    assert (await job.run())[0] == "succeeded"
    warning = next(p for t, p in events if t == "run_warning")
    assert "node 9 (SaveImage): missing.png could not be copied from the ComfyUI on box cuda:1" in warning["message"]


async def test_a_node_error_fails_the_run_naming_the_node_and_the_card(aiohttp_server, tmp_path):
    fake = FakeComfy([msg("execution_start"), msg("executing", node="3"), msg(
        "execution_error", node_id="3", node_type="KSampler", exception_message="bad value\n",
        exception_type="ValueError", traceback=["  File a\n", "  File b\n"])])
    job, events, _ = await start(aiohttp_server, fake, tmp_path)
    status, error, extra = await job.run()
    assert (status, error, extra) == ("failed", "node 3 (KSampler) failed on box cuda:1: bad value", {})
    err = next(p for t, p in events if t == "node_error")
    assert err == {"node": "3", "class_type": "KSampler", "message": "bad value", "traceback": "  File a\n  File b\n"}


async def test_out_of_memory_gives_the_oom_facts(aiohttp_server, tmp_path):
    fake = FakeComfy([msg("execution_start"), msg("execution_error", node_id="3", node_type="KSampler",
                                                  exception_message="CUDA out of memory. Tried to allocate")])
    job, _, _ = await start(aiohttp_server, fake, tmp_path)
    status, _, extra = await job.run()
    assert status == "failed"
    assert extra == {"out_of_memory": {"device": "cuda:1", "budget_gib": 4.0, "simulated": False}}


async def test_comfyuis_refusal_fails_the_run_with_its_validation(aiohttp_server, tmp_path):
    answer = {"error": {"type": "prompt_outputs_failed_validation", "message": "Prompt outputs failed validation",
                        "details": ""},
              "node_errors": {"3": {"errors": [{"message": "Value not in list", "details": "sampler_name: 'x'"}],
                                    "class_type": "KSampler"}}}
    fake = FakeComfy([], prompt_status=400, prompt_answer=answer)
    job, _, _ = await start(aiohttp_server, fake, tmp_path)
    status, error, extra = await job.run()
    assert status == "failed" and extra == {"validation": answer}
    assert error == ("the ComfyUI on box cuda:1 refused the workflow: Prompt outputs failed validation; "
                     "node 3 (KSampler): Value not in list: sampler_name: 'x'")


async def test_a_stop_interrupts_the_running_prompt(aiohttp_server, tmp_path):
    fake = FakeComfy([msg("execution_start"), msg("executing", node="3"), "wait_interrupt"])
    job, events, stop_event = await start(aiohttp_server, fake, tmp_path)
    task = asyncio.create_task(job.run())
    for _ in range(200):  # until the node runs (bounded)
        if events:
            break
        await asyncio.sleep(0.02)
    stop_event.set()
    assert await asyncio.wait_for(task, 10) == ("cancelled", "cancelled by request", {})
    assert fake.interrupts == [{"prompt_id": "p1"}] and fake.deleted == [{"delete": ["p1"]}]


async def test_a_host_stop_before_anything_was_queued_ends_interrupted(aiohttp_server, tmp_path):
    fake = FakeComfy(SUCCESS)
    job, _, _ = await start(aiohttp_server, fake, tmp_path, stop=True, reason="interrupt")
    status, error, _ = await job.run()
    assert status == "interrupted" and "server was stopped" in error
    assert fake.prompts == []


async def test_an_instance_that_dies_fails_the_run_naming_the_card_the_node_and_its_log(aiohttp_server, tmp_path):
    fake = FakeComfy([msg("execution_start"), msg("executing", node="3"), "close"])
    job, _, _ = await start(aiohttp_server, fake, tmp_path)
    status, error, _ = await job.run()
    assert status == "failed"
    assert error == ("the ComfyUI on box cuda:1 died while running node 3 (KSampler); see its log "
                     "/h/comfyui/box/cuda_1/comfyui.log")


async def test_an_instance_that_does_not_answer_fails_the_run(tmp_path):
    events: list[Any] = []
    spec = {"run_id": "r1", "graph": GRAPH, "worker": None,
            "comfyui": {"url": "http://127.0.0.1:9", "instance": "cpu", "devices": ["cpu"], "log": "L"}}
    job = ComfyRun(spec, tmp_path, lambda t, p: events.append(t), threading.Event(), stopped(None))
    assert await job.run() == ("failed", "the ComfyUI on this server cpu died; see its log L", {})


def test_run_comfy_reports_the_facts_and_completes_the_outputs(tmp_path):
    events: list[tuple[str, dict[str, Any]]] = []
    facts: dict[str, Any] = {"pid": 1}
    spec = {"run_id": "r1", "graph": GRAPH, "comfyui": None}
    status, error, _ = run_comfy(spec, tmp_path, lambda t, p: events.append((t, p)), facts, threading.Event(),
                                 stopped(None))
    assert status == "failed" and "no ComfyUI instance" in (error or "")
    assert [t for t, _ in events] == ["run_started", "outputs_recorded"]
    assert facts["run_kind"] == "comfyui" and facts["comfyui"]["cold_start"] is False
    assert json.loads((tmp_path / "recorded_outputs" / "index.json").read_text())["complete"] is True


@pytest.mark.parametrize(("name", "kind"), [("a.PNG", "image"), ("v.mp4", "video"), ("s.flac", "audio"),
                                            ("m.glb", "file")])
def test_file_kinds(name, kind):
    assert file_kind(name) == kind


def test_output_files_finds_every_named_file():
    out = {"images": [{"filename": "a.png", "type": "output"}, {"x": 1}], "gifs": [{"filename": "b.gif"}],
           "text": ["t"], "flag": True}
    assert [(k, i, f["filename"]) for k, i, f in output_files(out)] == [("images", 0, "a.png"), ("gifs", 0, "b.gif")]
    assert output_files(None) == []


async def test_a_stop_while_queued_behind_another_prompt_takes_it_off_the_queue(aiohttp_server, tmp_path):
    fake = FakeComfy([])  # ComfyUI is busy with another prompt: nothing about this one
    job, _, stop_event = await start(aiohttp_server, fake, tmp_path)
    task = asyncio.create_task(job.run())
    for _ in range(200):  # until the prompt is posted (bounded)
        if fake.prompts:
            break
        await asyncio.sleep(0.02)
    stop_event.set()
    assert (await asyncio.wait_for(task, 10))[0] == "cancelled"
    assert fake.deleted == [{"delete": ["p1"]}] and fake.interrupts == [{"prompt_id": "p1"}]
