"""Results come home (server/comfy/home.py): ``POST /xpufleet/runs/{id}/home`` on the ComfyUI stand-in copies
a ComfyUI run's files from an aiohttp app standing where the sidecar would (the outputs API of
server/sidecar/routes/outputs.py) into ComfyUI's output folder, and never writes outside it."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from xpufleet.common.runtime_file import write_runtime
from xpufleet.server.comfy import home as home_mod

PAIRING = "xfp_the-browsers-pairing"
PAGE_HEADERS = {"X-XPUFleet-Request": "1", "X-XPUFleet-Pairing": PAIRING}
RUN = "0123456789abcdef0123456789abcdef"
PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 64


class Sidecar:
    """The outputs API of one ComfyUI run (the recorded-outputs layout of docs/comfyui.md), counting file reads."""

    def __init__(self) -> None:
        self.status = "succeeded"
        self.run_fields: dict[str, Any] = {"kind": "comfyui"}
        self.nodes: dict[str, dict[str, Any]] = {
            "9": {"class_type": "SaveImage", "outputs": [
                {"kind": "image", "name": "images", "index": 0, "file": "ComfyUI_00001_.png", "bytes": len(PNG),
                 "media_type": "image/png"},
                {"kind": "image", "name": "images", "index": 1, "file": "ComfyUI_00002_.png", "bytes": len(PNG) + 1,
                 "media_type": "image/png"}]},
            "12": {"class_type": "SaveAudio", "outputs": [
                {"kind": "audio", "name": "audio", "index": 0, "file": "clip.flac", "bytes": 5, "media_type": "audio/flac"},
                {"kind": "tensor", "name": "t", "index": 1, "file": "0_t.safetensors", "bytes": 3}]},
        }
        self.data: dict[tuple[str, str], bytes] = {
            ("9", "ComfyUI_00001_.png"): PNG, ("9", "ComfyUI_00002_.png"): PNG + b"x",
            ("12", "clip.flac"): b"fLaC!", ("12", "0_t.safetensors"): b"abc"}
        self.reads: list[tuple[str, str]] = []
        self.outputs_error: tuple[int, str] | None = None  # what GET /outputs answers instead of the listing
        self.app = web.Application()
        self.app.router.add_get("/api/runs/{run_id}", self.run)
        self.app.router.add_get("/api/runs/{run_id}/outputs", self.listing)
        self.app.router.add_get("/api/runs/{run_id}/outputs/{node}", self.manifest)
        self.app.router.add_get("/api/runs/{run_id}/outputs/{node}/{file}", self.file)

    def _check(self, request: web.Request) -> None:
        if request.headers.get("Authorization") != f"Bearer {PAIRING}":
            raise web.HTTPUnauthorized(text=json.dumps({"error": "pairing refused", "pairing": "refused"}),
                                       content_type="application/json")
        if request.match_info["run_id"] != RUN:
            raise web.HTTPNotFound(text=json.dumps({"error": f"run {request.match_info['run_id']} not found"}),
                                   content_type="application/json")

    async def run(self, request: web.Request) -> web.Response:
        self._check(request)
        return web.json_response({"id": RUN, "status": self.status, **self.run_fields})

    async def listing(self, request: web.Request) -> web.Response:
        self._check(request)
        if self.outputs_error is not None:
            status, text = self.outputs_error
            return web.json_response({"error": text}, status=status)
        return web.json_response({"run_id": RUN, "complete": True, "nodes": [
            {"node": n, "class_type": m["class_type"], "files": [o["file"] for o in m["outputs"] if "file" in o]}
            for n, m in self.nodes.items()]})

    async def manifest(self, request: web.Request) -> web.Response:
        self._check(request)
        node = request.match_info["node"]
        return web.json_response({"node": node, **self.nodes[node]})

    async def file(self, request: web.Request) -> web.Response:
        self._check(request)
        key = (request.match_info["node"], request.match_info["file"])
        self.reads.append(key)
        return web.Response(body=self.data[key], content_type="application/octet-stream")


@pytest.fixture
async def comfy(comfy_host, xpufleet_home, aiohttp_client):
    instance, load = comfy_host
    load()
    return await aiohttp_client(instance.make_app(), headers=PAGE_HEADERS)


@pytest.fixture
async def sidecar(aiohttp_client, xpufleet_home) -> Sidecar:
    side = Sidecar()
    url = str((await aiohttp_client(side.app)).make_url("")).rstrip("/")
    write_runtime(xpufleet_home, {"url": url, "token": "xfs_not-used", "pid": os.getpid(), "version": "0.1.0"})
    return side


@pytest.fixture
def output_dir() -> Path:
    import folder_paths  # the stand-in the comfy_host fixture put first on sys.path

    out = Path(folder_paths.get_output_directory())
    out.mkdir(parents=True, exist_ok=True)
    return out


def files_under(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


async def test_a_runs_files_come_home_once(comfy, sidecar, output_dir):
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home", json={})
    body = await r.json()
    assert r.status == 200, body
    assert body["subfolder"] == f"xpufleet/{RUN}"
    got = [(f["node"], f["class_type"], f["file"], f["kind"], f["copied"]) for f in body["files"]]
    assert got == [("9", "SaveImage", "9_ComfyUI_00001_.png", "image", True),
                   ("9", "SaveImage", "9_ComfyUI_00002_.png", "image", True),
                   ("12", "SaveAudio", "12_clip.flac", "audio", True)]  # a tensor does not come home
    first = body["files"][0]
    assert first["type"] == "output" and first["subfolder"] == f"xpufleet/{RUN}"
    assert first["url"] == f"/view?filename=9_ComfyUI_00001_.png&subfolder=xpufleet%2F{RUN}&type=output"
    assert (output_dir / "xpufleet" / RUN / "9_ComfyUI_00001_.png").read_bytes() == PNG
    assert files_under(output_dir) == {f"xpufleet/{RUN}/{f['file']}" for f in body["files"]}
    assert len(sidecar.reads) == 3
    # again: nothing fetched, the same answer; ComfyUI's /api/ twin too
    r = await comfy.post(f"/api/xpufleet/runs/{RUN}/home")
    again = await r.json()
    assert r.status == 200 and len(sidecar.reads) == 3
    assert [f["file"] for f in again["files"]] == [f["file"] for f in body["files"]]
    assert not any(f["copied"] for f in again["files"])
    # a file cut short (its size differs from the manifest's) is fetched again
    (output_dir / "xpufleet" / RUN / "12_clip.flac").write_bytes(b"f")
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert [f["copied"] for f in (await r.json())["files"]] == [False, False, True]
    assert (output_dir / "xpufleet" / RUN / "12_clip.flac").read_bytes() == b"fLaC!"


async def test_a_run_without_media_makes_no_folder(comfy, sidecar, output_dir):
    sidecar.nodes = {"4": {"class_type": "XPUTrainingLoop", "outputs": [
        {"kind": "metrics", "name": "metrics", "index": 0}, {"kind": "model", "name": "m", "index": 1, "file": "1_m.safetensors"}]}}
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert r.status == 200 and (await r.json())["files"] == []
    assert not (output_dir / "xpufleet").exists() and sidecar.reads == []


@pytest.mark.parametrize("status", [404, 409])
async def test_a_run_whose_outputs_the_sidecar_cannot_give_has_nothing_to_bring_home(comfy, sidecar, output_dir,
                                                                                      status):
    # a training run that recorded nothing here, or keeps its outputs on a worker not connected now: the
    # page asks for every run that recorded outputs, and an error status would be a console error there
    sidecar.run_fields = {"kind": "graph", "options": {"record_outputs": True}}
    sidecar.outputs_error = (status, "run r keeps no recorded outputs here")
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert r.status == 200
    body = await r.json()
    assert body["files"] == [] and body["models"] == [] and "no recorded outputs" in body["unavailable"]
    assert files_under(output_dir) == set() and sidecar.reads == []


async def test_only_a_succeeded_run_comes_home(comfy, sidecar, output_dir):
    sidecar.status = "running"
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert r.status == 409 and "running" in (await r.json())["error"]
    r = await comfy.post("/xpufleet/runs/ffffffffffffffffffffffffffffffff/home")
    assert r.status == 404 and "not found" in (await r.json())["error"]
    assert files_under(output_dir) == set()


@pytest.mark.parametrize("run_id", ["..", "%2E%2E", "a%2Fb", "..%2F..%2Fetc", "%2Fetc%2Fpasswd", ".hidden", "a.b",
                                    "x" * 65, "a%00b", "a%5Cb"])
async def test_a_bad_run_id_is_refused(comfy, sidecar, output_dir, run_id):
    r = await comfy.post(f"/xpufleet/runs/{run_id}/home")
    assert r.status in (400, 404), await r.text()
    assert sidecar.reads == [] and files_under(output_dir.parent) == set()


@pytest.mark.parametrize("node,file", [("9", "../../../evil.png"), ("9", "/etc/evil.png"), ("../..", "evil.png"),
                                       ("9", "..\\..\\evil.png"), ("9", "sub/dir/evil.png")])
async def test_names_from_the_sidecar_stay_inside_the_runs_folder(comfy, sidecar, output_dir, node, file):
    sidecar.nodes = {node: {"class_type": "SaveImage", "outputs": [
        {"kind": "image", "name": "images", "index": 0, "file": file, "bytes": 3}]}}
    sidecar.data = {(node, file): b"abc"}
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    body = await r.json()
    assert r.status == 200, body
    (name,) = [f["file"] for f in body["files"]]
    assert "/" not in name and "\\" not in name and not name.startswith(".")
    assert files_under(output_dir.parent) == {f"output/xpufleet/{RUN}/{name}"}


async def test_symbolic_links_are_refused(comfy, sidecar, output_dir, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the run's folder a link out of the output folder
    (output_dir / "xpufleet").mkdir()
    (output_dir / "xpufleet" / RUN).symlink_to(elsewhere, target_is_directory=True)
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert r.status == 403 and (await r.json())["refused"] == "symlink"
    assert list(elsewhere.iterdir()) == []
    # output/xpufleet itself a link
    (output_dir / "xpufleet" / RUN).unlink()
    (output_dir / "xpufleet").rmdir()
    (output_dir / "xpufleet").symlink_to(elsewhere, target_is_directory=True)
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert r.status == 403 and list(elsewhere.iterdir()) == []
    # a link where a file goes: not written through
    (output_dir / "xpufleet").unlink()
    folder = output_dir / "xpufleet" / RUN
    folder.mkdir(parents=True)
    victim = elsewhere / "victim.txt"
    victim.write_bytes(b"keep me")
    (folder / "9_ComfyUI_00001_.png").symlink_to(victim)
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert r.status == 403 and (await r.json())["refused"] == "symlink"
    assert victim.read_bytes() == b"keep me"


async def test_size_limits(comfy, sidecar, output_dir, monkeypatch):
    loaded = sys.modules["xpufleet_custom_node.server.comfy.home"]  # the plugin as ComfyUI loaded it
    monkeypatch.setattr(loaded, "MAX_FILE_BYTES", 10)
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert r.status == 413 and "ComfyUI_00001_.png" in (await r.json())["error"]
    assert sidecar.reads == []  # refused from the manifest's size, before any read
    monkeypatch.setattr(loaded, "MAX_FILE_BYTES", 1000)
    monkeypatch.setattr(loaded, "MAX_RUN_BYTES", 100)
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert r.status == 413 and "together" in (await r.json())["error"]


async def test_the_route_is_guarded_and_needs_a_sidecar(comfy_host, xpufleet_home, aiohttp_client, output_dir):
    instance, load = comfy_host
    load()
    bare = await aiohttp_client(instance.make_app())
    r = await bare.post(f"/xpufleet/runs/{RUN}/home", headers={"X-XPUFleet-Request": "1"})
    assert r.status == 401 and (await r.json())["pairing"] == "missing"
    r = await bare.post(f"/xpufleet/runs/{RUN}/home", headers={"X-XPUFleet-Pairing": PAIRING})
    assert r.status == 403 and (await r.json())["refused"] == "preflight"
    r = await bare.post(f"/xpufleet/runs/{RUN}/home", headers={**PAGE_HEADERS, "Origin": "http://evil.example"})
    assert r.status == 403
    r = await bare.post(f"/xpufleet/runs/{RUN}/home", headers=PAGE_HEADERS)
    assert r.status == 503 and "xpufleet start" in (await r.json())["error"]
    r = await bare.post(f"/xpufleet/runs/{RUN}/home", json={"x": 1}, headers=PAGE_HEADERS)
    assert r.status == 400


async def test_a_wrong_pairing_is_the_sidecars_refusal(comfy_host, xpufleet_home, aiohttp_client, sidecar, output_dir):
    instance, load = comfy_host
    load()
    other = await aiohttp_client(instance.make_app(), headers={**PAGE_HEADERS, "X-XPUFleet-Pairing": "xfp_other"})
    r = await other.post(f"/xpufleet/runs/{RUN}/home")
    body = await r.json()
    assert r.status == 401 and body["pairing"] == "refused" and "pairing refused" in body["error"]
    assert files_under(output_dir) == set()


def test_local_names():
    assert home_mod.local_name("9", "ComfyUI_00001_.png") == "9_ComfyUI_00001_.png"
    long = home_mod.local_name("9", "a" * 400 + ".png")
    assert len(long) == home_mod.MAX_NAME_CHARS and long.endswith(".png")
    for bad in ("..", "a/b", "", None, "é"):
        with pytest.raises(home_mod.ApiError):
            home_mod.check_run_id(bad)


def recorded_model() -> tuple[bytes, dict[str, Any], dict[str, Any]]:
    """What the run recorder keeps of a model output: its weights as safetensors; its spec in the manifest."""
    import torch
    from safetensors.torch import save

    state = {"0.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3), "0.bias": torch.ones(2)}
    spec = {"type": "mlp", "in_features": 3, "hidden": [], "out_features": 2}
    return save(state), state, spec


async def test_a_training_runs_saved_model_comes_home_to_the_model_folder(comfy, sidecar, output_dir):
    import folder_paths
    import torch

    from xpufleet.nodes.lib.modelfile import read_model_file

    data, state, spec = recorded_model()
    sidecar.run_fields = {"kind": "graph", "options": {"record_outputs": "upload"}, "graph": {
        "7": {"class_type": "XPUTrainingLoop", "inputs": {}},
        "8": {"class_type": "XPUModelSaver", "inputs": {"model": ["7", 0], "filename": "models/../../mlp.pt"}},
        "9": {"class_type": "XPUModelSaver", "inputs": {"model": ["7", 0], "filename": "models/mlp_digits.safetensors"}}}}
    sidecar.nodes = {"7": {"class_type": "XPUTrainingLoop", "outputs": [
        {"kind": "metrics", "name": "metrics", "index": 1, "value": {}},
        {"kind": "model", "name": "model", "index": 0, "file": "0_model.safetensors", "spec": spec}]}}
    sidecar.data = {("7", "0_model.safetensors"): data}
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    body = await r.json()
    assert r.status == 400 and "'..'" in body["error"]  # node 8's filename leads out: nothing written
    sidecar.run_fields["graph"]["8"]["inputs"]["filename"] = "models/mlp.pt"
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    body = await r.json()
    assert r.status == 200, body
    assert body["files"] == []
    assert [(m["node"], m["from_node"], m["file"], m["copied"]) for m in body["models"]] == [
        ("8", "7", "models/mlp.safetensors", True), ("9", "7", "models/mlp_digits.safetensors", True)]
    models = Path(folder_paths.models_dir) / "xpufleet"
    got_spec, got_state = read_model_file(models / "models" / "mlp_digits.safetensors")  # as ModelLoader reads it
    assert got_spec == spec and all(torch.equal(got_state[k], v) for k, v in state.items())
    assert len(sidecar.reads) == 2
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert [m["copied"] for m in (await r.json())["models"]] == [False, False] and len(sidecar.reads) == 2
    # without the upload choice: no model comes home
    sidecar.run_fields["options"] = {"record_outputs": True}
    r = await comfy.post(f"/xpufleet/runs/{RUN}/home")
    assert (await r.json())["models"] == []


def test_model_paths():
    assert home_mod.model_path("models/mlp.pt") == "models/mlp.safetensors"
    assert home_mod.model_path("a\\b/c") == "a/b/c.safetensors"
    for bad in ("", "..", "a/../b", None):
        with pytest.raises(home_mod.ApiError):
            home_mod.model_path(bad)
