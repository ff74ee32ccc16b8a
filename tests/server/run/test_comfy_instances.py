"""The headless ComfyUI instances (server/run/comfy_instances.py) with a stand-in ComfyUI: a ``main.py`` that
serves ``/system_stats``, ``/object_info`` and ``/models`` on the port it is given (a real ComfyUI takes
10-15 s to start; tests/e2e/test_comfy_workflows_e2e.py runs the real one). Started, kept warm, replaced
when dead, stopped when idle and at the end, by process group; the reading reduced to the agent protocol's
``comfyui`` message."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

import pytest

from xpufleet.server.contracts.agent_protocol import ComfyuiInfo
from xpufleet.server.run.comfy_instances import (
    ComfyError,
    ComfyInstall,
    ComfyInstances,
    find_install,
    instance_key,
    reduce_input,
    reduce_object_info,
)

FAKE_MAIN = r'''
import json, os, sys
from http.server import BaseHTTPRequestHandler, HTTPServer

args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
with open(os.environ["FAKE_ARGS_LOG"], "a") as f:
    f.write(json.dumps({"argv": args, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"), "pid": os.getpid()}) + "\n")
if os.environ.get("FAKE_FAIL"):
    print("boom: cannot start", flush=True)
    sys.exit(3)
INFO = {"ImageScale": {"input": {"required": {"image": ["IMAGE"], "upscale_method": [["nearest", "bilinear"]],
                                              "width": ["INT", {"default": 512}]},
                                 "optional": {"crop": ["COMBO", {"options": ["disabled", "center"]}]},
                                 "hidden": {"prompt": "PROMPT"}},
                       "output": ["IMAGE"]}}
ROUTES = {"/system_stats": {"system": {"comfyui_version": "9.9.9"}}, "/prompt": {"exec_info": {"queue_remaining": 0}},
          "/object_info": INFO,
          "/models": ["checkpoints", "loras"], "/models/checkpoints": ["a.safetensors", "sub\\b.ckpt"],
          "/models/loras": []}

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = ROUTES.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(json.dumps(body).encode())
    def log_message(self, *a):
        pass

HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_comfy(tmp_path, monkeypatch) -> ComfyInstall:
    folder = tmp_path / "ComfyUI"
    (folder / "comfy").mkdir(parents=True)
    (folder / "nodes.py").write_text("")
    (folder / "main.py").write_text(FAKE_MAIN)
    monkeypatch.setenv("FAKE_ARGS_LOG", str(tmp_path / "args.jsonl"))
    return ComfyInstall(folder, sys.executable)


def started(tmp_path: Path) -> list[dict]:
    import json

    path = tmp_path / "args.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (not reaped yet) counts as gone
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


async def test_an_instance_starts_on_demand_stays_warm_and_stops_at_the_end(fake_comfy, tmp_path):
    mgr = ComfyInstances(fake_comfy, tmp_path / "home", "box", idle_s=60, start_timeout_s=30)
    try:
        lease = await mgr.acquire(["cuda:1"], cpu=False, env={"CUDA_VISIBLE_DEVICES": "1"})
        assert lease["started"] is True and lease["instance"] == "cuda:1" and lease["version"] == "9.9.9"
        assert lease["url"].startswith("http://127.0.0.1:") and lease["devices"] == ["cuda:1"]
        folder = tmp_path / "home" / "comfyui" / "box" / "cuda_1"
        assert lease["output_dir"] == str(folder / "output") and lease["log"] == str(folder / "comfyui.log")
        assert all((folder / d).is_dir() for d in ("output", "temp", "input", "user"))
        (first,) = started(tmp_path)
        argv = first["argv"]
        assert argv[argv.index("--listen") + 1] == "127.0.0.1" and "--disable-auto-launch" in argv
        assert argv[argv.index("--output-directory") + 1] == str(folder / "output")
        assert argv[argv.index("--user-directory") + 1] == str(folder / "user")
        assert "--cpu" not in argv and first["cuda"] == "1"
        mgr.release("cuda:1")
        again = await mgr.acquire(["cuda:1"], cpu=False)
        assert again["started"] is False and again["pid"] == lease["pid"] and len(started(tmp_path)) == 1
        mgr.release("cuda:1")
        cpu = await mgr.acquire(["cpu"], cpu=True)
        assert cpu["instance"] == "cpu" and "--cpu" in started(tmp_path)[1]["argv"]
        assert started(tmp_path)[1]["cuda"] == ""
        mgr.release("cpu")
    finally:
        await mgr.stop_all()
    assert not alive(lease["pid"]) and not alive(cpu["pid"])
    with pytest.raises(ComfyError, match="stopping"):
        await mgr.acquire(["cuda:1"], cpu=False)


async def test_a_dead_instance_is_replaced_by_the_next_run(fake_comfy, tmp_path):
    mgr = ComfyInstances(fake_comfy, tmp_path / "home", "box", idle_s=60, start_timeout_s=30)
    try:
        lease = await mgr.acquire(["cuda:0"], cpu=True)
        mgr.release("cuda:0")
        os.kill(lease["pid"], signal.SIGKILL)
        for _ in range(100):  # until the child is reaped (bounded)
            if mgr.instances["cuda:0"].proc.returncode is not None:  # type: ignore[union-attr]
                break
            await asyncio.sleep(0.05)
        fresh = await mgr.acquire(["cuda:0"], cpu=True)
        assert fresh["started"] is True and fresh["pid"] != lease["pid"]
        mgr.release("cuda:0")
    finally:
        await mgr.stop_all()


async def test_an_idle_instance_is_stopped(fake_comfy, tmp_path):
    mgr = ComfyInstances(fake_comfy, tmp_path / "home", "box", idle_s=0.3, start_timeout_s=30)
    try:
        lease = await mgr.acquire(["cuda:0"], cpu=True)
        await asyncio.sleep(0.5)
        assert "cuda:0" in mgr.instances  # in use: never idle-stopped
        mgr.release("cuda:0")
        for _ in range(100):  # until it is stopped and gone (bounded)
            if "cuda:0" not in mgr.instances and not alive(lease["pid"]):
                break
            await asyncio.sleep(0.05)
        assert "cuda:0" not in mgr.instances and not alive(lease["pid"])
    finally:
        await mgr.stop_all()


async def test_a_comfyui_that_cannot_start_says_why_with_its_log(fake_comfy, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    mgr = ComfyInstances(fake_comfy, tmp_path / "home", "box", idle_s=60, start_timeout_s=30)
    with pytest.raises(ComfyError, match=r"(?s)exited while starting \(code 3\).*boom: cannot start"):
        await mgr.acquire(["cuda:0"], cpu=True)
    await mgr.stop_all()


async def test_the_reading_is_the_comfyui_message(fake_comfy, tmp_path):
    mgr = ComfyInstances(fake_comfy, tmp_path / "home", "box", idle_s=60, start_timeout_s=30)
    try:
        reading = await mgr.read()
    finally:
        await mgr.stop_all()
    assert reading["ok"] is True and reading["version"] == "9.9.9" and reading["path"] == str(fake_comfy.path)
    assert reading["classes"] == {"ImageScale": {
        "inputs": {"image": {"type": "IMAGE", "required": True, "options": None},
                   "upscale_method": {"type": "COMBO", "required": True, "options": ["nearest", "bilinear"]},
                   "width": {"type": "INT", "required": True, "options": None},
                   "crop": {"type": "COMBO", "required": False, "options": ["disabled", "center"]}},
        "outputs": ["IMAGE"]}}
    assert reading["models"] == {"checkpoints": ["a.safetensors", "sub/b.ckpt"], "loras": []}
    ComfyuiInfo.model_validate({"type": "comfyui", **reading})  # the protocol's own model accepts it


async def test_a_reading_that_fails_says_so(fake_comfy, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_FAIL", "1")
    mgr = ComfyInstances(fake_comfy, tmp_path / "home", "box", idle_s=60, start_timeout_s=30)
    reading = await mgr.read()
    await mgr.stop_all()
    assert reading["ok"] is False and "exited while starting" in reading["error"]


def test_instance_keys():
    assert instance_key(["cuda:1"]) == "cuda:1"
    assert instance_key(["cuda:2", "cuda:0"]) == "cuda:2+cuda:0"
    assert instance_key(["cpu"]) == instance_key([]) == "cpu"


def test_reduce_input_forms():
    assert reduce_input([["a", "b"], {"default": "a"}], True) == {"type": "COMBO", "required": True,
                                                                 "options": ["a", "b"]}
    assert reduce_input(["COMBO", {"options": ["x"]}], False) == {"type": "COMBO", "required": False, "options": ["x"]}
    assert reduce_input(["FLOAT"], True)["options"] is None
    assert reduce_object_info({"Bad": "x", "N": {"input": {}, "output": [["a", "b"], "INT"]}}) == {
        "N": {"inputs": {}, "outputs": ["COMBO", "INT"]}}


def test_find_install(tmp_path, fake_comfy):
    assert find_install(str(fake_comfy.path), "/bin/sh", env={}) == ComfyInstall(fake_comfy.path, "/bin/sh")
    venv = fake_comfy.path / "venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("")
    assert find_install(None, None, env={"XPUFLEET_COMFYUI": str(fake_comfy.path)}).python == str(venv / "python")
    with pytest.raises(ComfyError, match="is not a ComfyUI folder: it has no main.py"):
        find_install(str(tmp_path), None, env={})
    assert find_install(None, None, env={}) is None  # this interpreter's environment is no ComfyUI's


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_an_instance_does_not_outlive_a_host_killed_with_sigkill(fake_comfy, tmp_path):
    import subprocess
    import time

    host = (
        "import asyncio, sys, time\n"
        "from pathlib import Path\n"
        "from xpufleet.server.run.comfy_instances import ComfyInstall, ComfyInstances\n"
        "async def main():\n"
        f"    mgr = ComfyInstances(ComfyInstall(Path({str(fake_comfy.path)!r}), sys.executable), "
        f"Path({str(tmp_path / 'home')!r}), 'box', idle_s=60, start_timeout_s=30)\n"
        "    lease = await mgr.acquire(['cpu'], cpu=True)\n"
        "    print(lease['pid'], flush=True)\n"
        "    await asyncio.sleep(60)\n"
        "asyncio.run(main())\n")
    proc = subprocess.Popen([sys.executable, "-c", host], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        pid = int(proc.stdout.readline())
        assert alive(pid)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:  # SIGTERM from the kernel, then its own exit (bounded)
        time.sleep(0.05)
    survived = alive(pid)
    if survived:  # never left behind, even when the test fails
        os.kill(pid, signal.SIGKILL)
    assert not survived, "the instance outlived its host"


def test_an_agent_inside_comfyuis_environment_finds_it(fake_comfy, monkeypatch):
    monkeypatch.setattr(sys, "prefix", str(fake_comfy.path / ".venv"))  # ComfyUI/.venv runs this interpreter
    assert find_install(None, None, env={}) == ComfyInstall(fake_comfy.path.resolve(), sys.executable)
    portable = fake_comfy.path.parent / "python_embeded"  # a portable build: python_embeded beside ComfyUI/
    monkeypatch.setattr(sys, "prefix", str(portable))
    assert find_install(None, None, env={}).path == fake_comfy.path.resolve()


def test_the_owners_extra_arguments_go_to_every_instance(fake_comfy, tmp_path):
    mgr = ComfyInstances(fake_comfy, tmp_path, "box", env={"XPUFLEET_COMFYUI_ARGS": "--extra-model-paths-config '/a b.yaml'"})
    from xpufleet.server.run.comfy_instances import Instance

    argv = mgr.argv(Instance("cpu", tmp_path, ["cpu"], cpu=True))
    assert argv[-3:] == ["--cpu", "--extra-model-paths-config", "/a b.yaml"]
    with pytest.raises(ComfyError, match="XPUFLEET_COMFYUI_ARGS: No closing quotation"):
        ComfyInstances(fake_comfy, tmp_path, "box", env={"XPUFLEET_COMFYUI_ARGS": "--x 'open"})
