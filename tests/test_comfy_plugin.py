"""The package loads inside (a stand-in of) ComfyUI the way ComfyUI loads custom nodes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_loads_as_custom_node_and_finds_nodes_and_web(comfy_host):
    instance, load = comfy_host
    mod = load()
    assert mod.WEB_DIRECTORY == "./web"
    web_dir = REPO / mod.WEB_DIRECTORY
    assert (web_dir / "xpu_monitor.js").is_file()
    mappings = mod.NODE_CLASS_MAPPINGS
    for name in ("XPUDataset", "XPUDataLoader", "XPUMLP", "XPUCNN", "XPUSequential", "XPUOptimizer", "XPULRScheduler", "XPULoss", "XPUTrainingLoop", "XPUEvaluate", "XPUModelSaver", "XPUModelLoader", "XPUPredict"):
        assert name in mappings, name
        cls = mappings[name]
        assert callable(cls.INPUT_TYPES) and hasattr(cls, "RETURN_TYPES") and hasattr(cls, "FUNCTION")
        assert getattr(cls(), cls.FUNCTION)
        assert name in mod.NODE_DISPLAY_NAME_MAPPINGS
    # Routes are registered under the plugin's prefix on ComfyUI's route table.
    paths = {r.path for r in instance.routes if hasattr(r, "path")}
    assert "/xpufleet/version" in paths
    assert all(p.startswith("/xpufleet/") for p in paths)


async def test_version_route_answers(comfy_host, aiohttp_client):
    instance, load = comfy_host
    load()
    client = await aiohttp_client(instance.make_app())
    resp = await client.get("/xpufleet/version")
    assert resp.status == 200
    body = await resp.json()
    assert body["name"] == "xpufleet"


def test_import_is_cheap_and_never_imports_torch():
    code = (
        "import sys, time; t=time.perf_counter(); import xpufleet; dt=time.perf_counter()-t; "
        "bad=[m for m in ('torch','pynvml','sklearn','tensorboard') if m in sys.modules]; "
        "print(bad, round(dt,3))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    bad, _seconds = out.stdout.rsplit(" ", 1)
    assert bad.strip() == "[]", out.stdout


def test_import_without_host_registers_nothing():
    # A fresh interpreter outside the repo: no ComfyUI `server` module, so no routes, but the nodes load.
    code = (
        "import sys, xpufleet; from xpufleet.server.comfy import routes as comfy_routes; "
        "print(comfy_routes.register(), 'XPUTrainingLoop' in xpufleet.NODE_CLASS_MAPPINGS, 'server' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd="/")
    assert out.stdout.split() == ["False", "True", "False"], out.stdout + out.stderr
