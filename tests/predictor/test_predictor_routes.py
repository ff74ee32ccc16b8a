"""Routes: ``/xpufleet/snapshot`` and ``/xpufleet/predict`` inside ComfyUI (the stand-in host, the
repository loaded as ComfyUI loads it) and ``/api/snapshot`` / ``/api/predict`` on a sidecar app."""

from __future__ import annotations

import json
import os
import sys

import pytest
from aiohttp import web

from xpufleet.constants import MAX_REQUEST_BODY_BYTES
from xpufleet.predictor.resolve import DirsResolver
from xpufleet.predictor.service import apply_override, predict_workflow
from xpufleet.predictor.snapshot import Snapshot, clear_cache
from xpufleet.server.sidecar.routes.predictor import add_sidecar_routes

GiB = 1024**3
OVERRIDE = {"vram_free_gb": 20.0, "vram_allocated_gb": 1.0, "vram_reserved_gb": 0.5, "ram_free_gb": 32.0,
            "commit_used_gb": 10.0, "commit_limit_gb": 48.0}


async def run(aiohttp_client, app: web.Application, fn):
    """``fn(client)`` on ``app`` served on loopback by pytest-aiohttp (torn down when an assert fails)."""
    return await fn(await aiohttp_client(app))


@pytest.fixture
def comfy_app(comfy_host, tmp_path, sparse):
    instance, load = comfy_host
    import folder_paths  # ComfyUI has it imported before any custom node loads

    root = tmp_path / "comfy_models"
    for name in ("diffusion_models", "text_encoders", "vae"):
        folder_paths.set_folder(name, [str(root / name)])
    sparse(root / "diffusion_models/flux-2-klein-base-4b.safetensors", 8 * GiB)
    sparse(root / "text_encoders/qwen_3_4b.safetensors", 5 * GiB)
    sparse(root / "vae/flux2-vae.safetensors", GiB)
    load()
    clear_cache()
    return instance.make_app(), root


async def test_comfy_snapshot_route(comfy_app, aiohttp_client):
    app, _root = comfy_app

    async def go(client):
        r = await client.get("/xpufleet/snapshot")
        assert r.status == 200
        body = await r.json()
        assert {"snapshot", "snapshots"} <= set(body)
        s = body["snapshot"]
        for field in ("vram_free_gb", "vram_total_gb", "vram_allocated_gb", "vram_reserved_gb", "ram_free_gb",
                      "commit_used_gb", "commit_limit_gb", "device", "platform", "reason"):
            assert field in s
        assert s["ram_free_gb"] > 0
        assert s["device"] in {x["device"] for x in body["snapshots"]}
        r = await client.get("/xpufleet/snapshot", params={"device": "cuda:7"})
        assert r.status == 404 and "no device 'cuda:7'" in (await r.json())["error"]

    await run(aiohttp_client, app, go)


async def test_comfy_predict_route_uses_comfy_folders(comfy_app, template, aiohttp_client):
    app, root = comfy_app
    wf = template("image_flux2_klein_text_to_image.json")

    async def go(client):
        r = await client.post("/xpufleet/predict", json={"workflow": wf, "platform": "nvidia", "snapshot": OVERRIDE})
        assert r.status == 200, await r.text()
        return await r.json()

    body = await run(aiohttp_client, app, go)
    assert body["scan"]["resolver"]["source"] == "comfyui"
    assert body["explanation"]["models"]["m_total_gb"] == pytest.approx(14.0)
    assert body["explanation"]["models"]["m_peak_gb"] == pytest.approx(8.0)
    assert {m["status"] for m in body["models"]} == {"found"}
    # the same answer as the service computes directly
    snap = apply_override(Snapshot(), OVERRIDE)
    direct = predict_workflow(wf, snap, platform="nvidia", resolver=DirsResolver(named={
        "diffusion_models": [root / "diffusion_models"], "text_encoders": [root / "text_encoders"],
        "vae": [root / "vae"]}))
    assert body["p_success"] == direct["p_success"]
    assert body["explanation"]["intermediates"] == direct["explanation"]["intermediates"]
    assert set(body["label"]) == {"zh", "en"} and body["color"].startswith("#")


async def test_comfy_predict_bad_input(comfy_app, template, xpufleet_home, aiohttp_client):
    app, _root = comfy_app
    wf = template("image_flux2_klein_text_to_image.json")
    evil = template("image_flux2_klein_text_to_image.json")
    sg = next(s for s in evil["definitions"]["subgraphs"] if any(n["type"] == "VAELoader" for n in s["nodes"]))
    next(n for n in sg["nodes"] if n["type"] == "VAELoader")["widgets_values"][0] = "../../../../etc/shadow"

    async def go(client):
        cases = [
            (b"{not json", 400, "not valid JSON"),
            (json.dumps([1, 2]).encode(), 400, "must be a JSON object"),
            (json.dumps({"platform": "nvidia"}).encode(), 400, "needs \"workflow\""),
            (json.dumps({"workflow": {"a": 1}}).encode(), 400, "not a ComfyUI workflow"),
            (json.dumps({"workflow": evil}).encode(), 400, "climbs out"),
            (json.dumps({"workflow": wf, "options": {"turbo": True}}).encode(), 400, "unknown option"),
            (json.dumps({"workflow": wf, "extra": 1}).encode(), 400, "unknown field"),
            (json.dumps({"workflow": wf, "worker": "w", "device": "cuda:0"}).encode(), 503, "no XPU Fleet sidecar"),
            (json.dumps({"workflow": wf, "worker": "w"}).encode(), 400, "name both worker and device"),
            (json.dumps({"workflow": wf, "device": "cuda:9"}).encode(), 404, "no device"),
            (json.dumps({"workflow": wf, "snapshot": {"vram_free_gb": "lots"}}).encode(), 400, "snapshot.vram_free_gb"),
        ]
        for data, status, text in cases:
            r = await client.post("/xpufleet/predict", data=data, headers={"Content-Type": "application/json"})
            body = await r.json()
            assert r.status == status and text in body["error"], (data[:60], r.status, body)
        r = await client.post("/xpufleet/predict", data=b"x" * (MAX_REQUEST_BODY_BYTES + 10))
        assert r.status == 413 and "error" in await r.json()

    await run(aiohttp_client, app, go)


async def test_comfy_predict_for_a_worker_card_asks_the_sidecar(comfy_app, template, xpufleet_home, aiohttp_client):
    """A worker's card from inside ComfyUI: its figures from the sidecar of XPUFLEET_HOME (the token
    from the runtime file, never from the browser), the models from ComfyUI's own folders."""
    from xpufleet.common.runtime_file import write_runtime
    from xpufleet.predictor.snapshot import snapshot_from_card

    app, _root = comfy_app
    wf = template("image_flux2_klein_text_to_image.json")
    card = dict(CARDS[0])
    seen = []

    async def snapshot(request):
        seen.append((dict(request.query), request.headers.get("Authorization")))
        if request.headers.get("Authorization") != "Bearer xfs_test":
            return web.json_response({"error": "wrong token"}, status=403)
        if request.query.get("device") != "cuda:0":
            return web.json_response({"error": "no card gpu-box/cuda:9"}, status=404)
        return web.json_response({"snapshot": snapshot_from_card(card).to_dict()})

    fake = web.Application()
    fake.router.add_get("/api/snapshot", snapshot)

    async def go(client):
        sidecar = await aiohttp_client(fake)
        write_runtime(xpufleet_home, {"url": str(sidecar.make_url("")).rstrip("/"), "pid": os.getpid(),
                                      "token": "xfs_test", "version": "test"})
        r = await client.post("/xpufleet/predict", json={"workflow": wf, "worker": "gpu-box", "device": "cuda:0"})
        body = await r.json()
        assert r.status == 200, body
        r = await client.post("/xpufleet/predict", json={"workflow": wf, "worker": "gpu-box", "device": "cuda:9"})
        missing = (r.status, await r.json())
        return body, missing

    body, missing = await run(aiohttp_client, app, go)
    assert seen[0] == ({"worker": "gpu-box", "device": "cuda:0"}, "Bearer xfs_test")
    assert body["snapshot"]["worker"] == "gpu-box" and body["snapshot"]["vram_free_gb"] == 6.0
    assert body["scan"]["resolver"]["source"] == "comfyui"
    assert body["explanation"]["models"]["m_peak_gb"] == pytest.approx(8.0)
    direct = predict_workflow(wf, snapshot_from_card(card), resolver=DirsResolver(named={
        "diffusion_models": [_root / "diffusion_models"], "text_encoders": [_root / "text_encoders"],
        "vae": [_root / "vae"]}))
    assert body["p_success"] == direct["p_success"]
    assert missing == (404, {"error": "no card gpu-box/cuda:9"})  # the sidecar's answer passes through


CARDS = [
    {"worker": "gpu-box", "device": "cuda:0", "total_gib": 24.0, "free_gib": 6.0, "kind": "cuda",
     "uuid": "GPU-1111", "simulated": False, "ram_free_gib": 16.0, "commit_used_gib": 10.0, "commit_limit_gib": 40.0},
    {"worker": "gpu-box", "device": "cuda:1", "total_gib": 80.0, "free_gib": 78.0, "kind": "cuda",
     "uuid": "GPU-2222", "simulated": True},
    {"worker": "arc", "device": "xpu:0", "total_gib": 16.0, "free_gib": 15.0, "kind": "xpu", "uuid": None,
     "simulated": False, "ram_free_gib": 30.0, "commit_used_gib": 5.0, "commit_limit_gib": 60.0},
]


@pytest.fixture
def sidecar_app(monkeypatch, tmp_path, sparse, xpufleet_home):
    monkeypatch.delitem(sys.modules, "folder_paths", raising=False)
    root = tmp_path / "models"
    sparse(root / "checkpoints/sd3.5_large_fp8_scaled.safetensors", 14 * GiB)
    sparse(root / "controlnet/sd3.5_large_controlnet_canny.safetensors", 4 * GiB)
    monkeypatch.setenv("XPUFLEET_MODEL_DIRS", str(root))
    clear_cache()
    app = web.Application()
    calls = []

    def cards():
        calls.append(1)
        return [dict(c) for c in CARDS]

    add_sidecar_routes(app, cards)
    return app, calls


async def test_sidecar_predict_on_a_worker_card(sidecar_app, template, aiohttp_client):
    app, calls = sidecar_app
    wf = template("sd3.5_large_canny_controlnet_example.json")

    async def go(client):
        out = {}
        for worker, device in (("gpu-box", "cuda:0"), ("gpu-box", "cuda:1"), ("arc", "xpu:0")):
            r = await client.post("/api/predict", json={"workflow": wf, "worker": worker, "device": device})
            assert r.status == 200, await r.text()
            out[device] = await r.json()
        r = await client.post("/api/predict", json={"workflow": wf})  # this machine's own device
        assert r.status == 200
        out["own"] = await r.json()
        return out

    out = await run(aiohttp_client, app, go)
    assert calls
    a = out["cuda:0"]
    assert a["snapshot"]["source"] == "heartbeat" and a["snapshot"]["worker"] == "gpu-box"
    assert a["explanation"]["inputs"]["vram_free_gb"] == 6.0 and a["explanation"]["platform"] == "nvidia"
    assert a["explanation"]["inputs"]["ram_free_gb"] == 16.0
    assert a["explanation"]["models"]["m_total_gb"] == pytest.approx(18.0)
    veff = 0.9 * 6.0
    assert a["explanation"]["intermediates"]["v_eff_gb"] == pytest.approx(veff)
    assert out["cuda:1"]["simulated"] is True and out["cuda:1"]["p_success"] == 100
    assert any("SIMULATED" in w for w in out["cuda:1"]["warnings"])
    assert out["xpu:0"]["explanation"]["gamma"] == 1.0 and out["xpu:0"]["explanation"]["platform"] == "intel"
    assert out["own"]["snapshot"]["source"] != "heartbeat"


async def test_sidecar_bad_card_requests(sidecar_app, template, aiohttp_client):
    app, _ = sidecar_app
    wf = template("sd3.5_large_canny_controlnet_example.json")

    async def go(client):
        r = await client.post("/api/predict", json={"workflow": wf, "worker": "nope", "device": "cuda:0"})
        body = await r.json()
        assert r.status == 404 and "known cards: gpu-box/cuda:0" in body["error"]
        r = await client.post("/api/predict", json={"workflow": wf, "worker": "gpu-box"})
        assert r.status == 400 and "name both worker and device" in (await r.json())["error"]
        r = await client.post("/api/predict", json={"workflow": "x"})
        assert r.status == 400

    await run(aiohttp_client, app, go)


async def test_sidecar_snapshot_route(sidecar_app, aiohttp_client):
    app, _ = sidecar_app

    async def go(client):
        r = await client.get("/api/snapshot")
        assert r.status == 200
        body = await r.json()
        assert [c["device"] for c in body["cards"]] == ["cuda:0", "cuda:1", "xpu:0"]
        assert body["cards"][1]["simulated"] is True
        assert body["snapshot"]["source"] in {"none", "nvml", "torch", "torch+nvml"}
        r = await client.get("/api/snapshot", params={"worker": "arc", "device": "xpu:0"})
        card = (await r.json())["snapshot"]
        assert (card["vram_free_gb"], card["platform"], card["worker"]) == (15.0, "intel", "arc")
        r = await client.get("/api/snapshot", params={"worker": "arc", "device": "xpu:9"})
        assert r.status == 404

    await run(aiohttp_client, app, go)
