"""An agent's ComfyUI (server/agent/comfyui.py) and the runs part's ComfyUI runs (server/agent/runs.py) without
a sidecar: the hello capability, the reading sent after welcome, a ComfyUI run refused by an agent that has
no ComfyUI, or whose ComfyUI cannot start. A stand-in ``main.py`` plays ComfyUI (the real one: the e2e test)."""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from xpufleet.server.agent.comfyui import AgentComfy
from xpufleet.server.agent.config import AgentConfig
from xpufleet.server.agent.runs import AgentRuns
from xpufleet.server.devices.inventory import Inventory
from xpufleet.server.devices.simulated import parse_simulate
from xpufleet.server.run.comfy_instances import ComfyInstall

FAKE_MAIN = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
if os.environ.get("FAKE_FAIL"):
    print("no torch here", flush=True)
    sys.exit(1)
port = int(sys.argv[sys.argv.index("--port") + 1])
ROUTES = {"/system_stats": {"system": {"comfyui_version": "0.3.64"}},
          "/object_info": {"SaveImage": {"input": {"required": {"images": ["IMAGE"]}}, "output": []}},
          "/models": ["checkpoints"], "/models/checkpoints": ["sd.safetensors"]}
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(json.dumps(ROUTES.get(self.path)).encode())
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''
WORKFLOW = {"1": {"class_type": "EmptyImage", "inputs": {}}, "2": {"class_type": "SaveImage", "inputs": {}}}


class Wire:
    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.connected = True

    async def send(self, text: str) -> bool:
        self.frames.append(json.loads(text))
        return True


@pytest.fixture
def install(tmp_path) -> ComfyInstall:
    folder = tmp_path / "ComfyUI"
    (folder / "comfy").mkdir(parents=True)
    (folder / "main.py").write_text(FAKE_MAIN)
    return ComfyInstall(folder, sys.executable)


def _cfg(tmp_path, comfyui: ComfyInstall | None) -> AgentConfig:
    return AgentConfig(name="box", home=tmp_path / "home", simulate=parse_simulate("cuda:0=24", "box"), comfyui=comfyui)


def _runs(cfg: AgentConfig, wire: Wire, comfy: AgentComfy | None) -> AgentRuns:
    inventory = Inventory(cfg.name, cfg.home, cfg.devices, cfg.simulate)
    return AgentRuns(cfg, inventory, wire.send, offered=inventory.snapshot, resume_grace_s=lambda: 300.0,
                     on_change=lambda: None, on_all_done=lambda: None, comfy=comfy)


async def _finished(runs: AgentRuns, wire: Wire, run_id: str) -> dict[str, Any]:
    rs = runs.table[run_id]
    if rs.task is not None:
        await rs.task
    (frame,) = [f for f in wire.frames if f.get("event_type") == "run_finished"]
    return frame["payload"]


async def test_an_agent_without_a_comfyui_fails_a_comfyui_run_saying_what_to_do(tmp_path):
    wire = Wire()
    cfg = _cfg(tmp_path, None)
    comfy = AgentComfy(cfg, wire.send, lambda: True)
    assert comfy.capabilities() == [] and not comfy.enabled
    runs = _runs(cfg, wire, comfy)
    await runs.start({"run_id": "r1", "devices": ["cuda:0"], "graph": WORKFLOW})
    payload = await _finished(runs, wire, "r1")
    assert payload["status"] == "failed"
    assert payload["error"] == ("worker box has no ComfyUI to run workflows: start its agent with --comfyui PATH "
                                "(the ComfyUI folder)")


async def test_a_comfyui_that_cannot_start_fails_the_run_naming_the_worker_and_card(tmp_path, install, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    wire = Wire()
    cfg = _cfg(tmp_path, install)
    comfy = AgentComfy(cfg, wire.send, lambda: True)
    runs = _runs(cfg, wire, comfy)
    try:
        await runs.start({"run_id": "r1", "devices": ["cuda:0"], "graph": WORKFLOW})
        payload = await _finished(runs, wire, "r1")
    finally:
        await comfy.stop_all()
    assert payload["status"] == "failed"
    assert payload["error"].startswith("the ComfyUI on box cuda:0 could not start: the ComfyUI instance cuda:0 "
                                       "exited while starting (code 1)")
    assert "no torch here" in payload["error"]


async def test_the_reading_goes_to_the_sidecar_once_read_and_after_each_welcome(tmp_path, install):
    wire = Wire()
    cfg = _cfg(tmp_path, install)
    comfy = AgentComfy(cfg, wire.send, lambda: wire.connected)
    assert comfy.capabilities() == ["comfyui"]
    await comfy.after_welcome()  # not read yet: nothing to send
    assert wire.frames == []
    try:
        comfy.start()
        assert comfy._task is not None
        await comfy._task
        (msg,) = wire.frames
        assert msg["type"] == "comfyui" and msg["ok"] is True and msg["version"] == "0.3.64"
        assert msg["classes"] == {"SaveImage": {"inputs": {"images": {"type": "IMAGE", "required": True,
                                                                      "options": None}}, "outputs": []}}
        assert msg["models"] == {"checkpoints": ["sd.safetensors"]} and msg["path"] == str(install.path)
        await comfy.after_welcome()
        assert wire.frames[1] == msg
        lease = await comfy.lease(["cpu"], cpu=True, env={})
        assert lease["started"] is False  # the reading's instance is the warm cpu instance
        comfy.release(["cpu"])
    finally:
        await comfy.stop_all()
    assert comfy.instances is not None and comfy.instances.instances == {}
