"""This server's own ComfyUI (server/sidecar/local_comfyui.py) with a stand-in ``main.py``: the provider is told
it is being read, then given the reading, the dispatcher woken each time; a run leases its instance; without a
ComfyUI a ComfyUI run is refused saying what to do."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from xpufleet.server.run.comfy_instances import ComfyError, ComfyInstall
from xpufleet.server.sidecar.local_comfyui import NO_COMFYUI, LocalComfy, lease_for

FAKE_MAIN = r'''
import json, sys
from http.server import BaseHTTPRequestHandler, HTTPServer
port = int(sys.argv[sys.argv.index("--port") + 1])
ROUTES = {"/system_stats": {"system": {"comfyui_version": "0.3.64"}},
          "/object_info": {"EmptyImage": {"input": {"required": {"width": ["INT", {}]}}, "output": ["IMAGE"]}},
          "/models": []}
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(json.dumps(ROUTES.get(self.path)).encode())
    def log_message(self, *a):
        pass
HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


class Provider:
    """What the door reads of the local provider (comfyui_probing / comfyui_read)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def comfyui_probing(self) -> None:
        self.calls.append(("probing", None))

    def comfyui_read(self, info: dict[str, Any]) -> None:
        self.calls.append(("read", info))


async def test_this_servers_comfyui_is_read_told_and_leased(tmp_path):
    folder = tmp_path / "ComfyUI"
    folder.mkdir()
    (folder / "main.py").write_text(FAKE_MAIN)
    provider, woken = Provider(), []
    comfy = LocalComfy(ComfyInstall(folder, sys.executable), tmp_path / "home", provider, lambda: woken.append(1))
    try:
        comfy.start()
        assert provider.calls == [("probing", None)] and woken == [1]
        assert comfy._task is not None
        await comfy._task
        (kind, info), = provider.calls[1:]
        assert kind == "read" and info["ok"] is True and info["version"] == "0.3.64" and woken == [1, 1]
        assert info["classes"]["EmptyImage"]["outputs"] == ["IMAGE"] and info["models"] == {}
        lease = await lease_for(comfy, ["cpu"])
        assert lease["started"] is False and "/comfyui/local/cpu/" in lease["output_dir"]
        comfy.release(["cpu"])
    finally:
        await comfy.stop()
    assert comfy.instances.instances == {}


async def test_without_a_comfyui_a_run_is_refused_saying_what_to_do():
    with pytest.raises(ComfyError) as err:
        await lease_for(None, ["cpu"])
    assert str(err.value) == NO_COMFYUI and "--comfyui PATH" in NO_COMFYUI
