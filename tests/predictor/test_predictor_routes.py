"""Routes: ``/xpufleet/snapshot`` and ``/xpufleet/predict`` inside ComfyUI (the stand-in host, the
repository loaded as ComfyUI loads it) and ``/api/snapshot`` / ``/api/predict`` on a sidecar app, each
served on loopback by pytest-aiohttp's ``aiohttp_client`` (torn down when an assert fails)."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pytest
from aiohttp import web

from xpufleet.constants import MAX_REQUEST_BODY_BYTES
from xpufleet.predictor.resolve import DirsResolver
from xpufleet.predictor.service import apply_override, predict_workflow
from xpufleet.predictor.snapshot import Snapshot, clear_cache, snapshot_from_card
from xpufleet.server.sidecar.routes.predictor import add_sidecar_routes

GiB = 1024**3
OVERRIDE = {"vram_free_gb": 20.0, "vram_allocated_gb": 1.0, "vram_reserved_gb": 0.5, "ram_free_gb": 32.0,
            "commit_used_gb": 10.0, "commit_limit_gb": 48.0}


async def answer(client: Any, method: str, path: str, status: int = 200, **request: Any) -> Any:
    """The JSON answer of one request, asserted to come with ``status``."""
    r = await client.request(method, path, **request)
    text = await r.text()
    assert r.status == status, (method, path, r.status, text[:2000])
    return json.loads(text)


def resolver_of(root: Any) -> DirsResolver:
    """The model folders the ComfyUI fixture fills, as the service's own resolver."""
    return DirsResolver(named={name: [root / name] for name in ("diffusion_models", "text_encoders", "vae")})


@pytest.fixture
async def comfy(comfy_host, tmp_path, sparse, aiohttp_client):
    """``(client, models root)``: ComfyUI's server app with the plugin loaded and a FLUX.2 klein's models."""
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
    # what the plugin's page sends (server/comfy/guard.py); the fake sidecar below takes the pairing as its token
    return await aiohttp_client(instance.make_app(), headers=PAGE_HEADERS), root


PAGE_HEADERS = {"X-XPUFleet-Request": "1", "X-XPUFleet-Pairing": "xfs_test"}


async def test_comfy_snapshot_route(comfy):
    client, _root = comfy
    body = await answer(client, "GET", "/xpufleet/snapshot")
    assert {"snapshot", "snapshots"} <= set(body)
    s = body["snapshot"]
    for field in ("vram_free_gb", "vram_total_gb", "vram_allocated_gb", "vram_reserved_gb", "ram_free_gb",
                  "commit_used_gb", "commit_limit_gb", "device", "platform", "reason"):
        assert field in s
    assert s["ram_free_gb"] > 0
    assert s["device"] in {x["device"] for x in body["snapshots"]}
    missing = await answer(client, "GET", "/xpufleet/snapshot", 404, params={"device": "cuda:7"})
    assert "no device 'cuda:7'" in missing["error"]


async def test_comfy_predict_route_uses_comfy_folders(comfy, template):
    client, root = comfy
    wf = template("image_flux2_klein_text_to_image.json")
    body = await answer(client, "POST", "/xpufleet/predict",
                        json={"workflow": wf, "platform": "nvidia", "snapshot": OVERRIDE})
    assert body["scan"]["resolver"]["source"] == "comfyui"
    assert body["explanation"]["models"]["m_total_gb"] == pytest.approx(14.0)
    assert body["explanation"]["models"]["m_peak_gb"] == pytest.approx(8.0)
    assert {m["status"] for m in body["models"]} == {"found"}
    # the same answer as the service computes directly
    direct = predict_workflow(wf, apply_override(Snapshot(), OVERRIDE), platform="nvidia", resolver=resolver_of(root))
    assert body["p_success"] == direct["p_success"]
    assert body["explanation"]["intermediates"] == direct["explanation"]["intermediates"]
    assert set(body["label"]) == {"zh", "en"} and body["color"].startswith("#")


async def test_comfy_predict_bad_input(comfy, template, xpufleet_home):
    client, _root = comfy
    wf = template("image_flux2_klein_text_to_image.json")
    evil = template("image_flux2_klein_text_to_image.json")
    sg = next(s for s in evil["definitions"]["subgraphs"] if any(n["type"] == "VAELoader" for n in s["nodes"]))
    next(n for n in sg["nodes"] if n["type"] == "VAELoader")["widgets_values"][0] = "../../../../etc/shadow"
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
        body = await answer(client, "POST", "/xpufleet/predict", status, data=data,
                            headers={"Content-Type": "application/json"})
        assert text in body["error"], (data[:60], body)
    too_large = await answer(client, "POST", "/xpufleet/predict", 413, data=b"x" * (MAX_REQUEST_BODY_BYTES + 10),
                             headers={"Content-Type": "application/json"})
    assert "error" in too_large


async def test_comfy_predict_for_a_worker_card_asks_the_sidecar(comfy, template, xpufleet_home, aiohttp_client):
    """A worker's card from inside ComfyUI: its figures from the sidecar of XPUFLEET_HOME (asked with the
    browser's pairing as the bearer, never the runtime file's token), the models from ComfyUI's own folders."""
    from xpufleet.common.runtime_file import write_runtime

    client, root = comfy
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
    sidecar = await aiohttp_client(fake)
    write_runtime(xpufleet_home, {"url": str(sidecar.make_url("")).rstrip("/"), "pid": os.getpid(),
                                  "token": "xfs_test", "version": "test"})
    body = await answer(client, "POST", "/xpufleet/predict", json={"workflow": wf, "worker": "gpu-box",
                                                                   "device": "cuda:0"})
    assert seen[0] == ({"worker": "gpu-box", "device": "cuda:0"}, "Bearer xfs_test")
    assert body["snapshot"]["worker"] == "gpu-box" and body["snapshot"]["vram_free_gb"] == 6.0
    assert body["scan"]["resolver"]["source"] == "comfyui"
    assert body["explanation"]["models"]["m_peak_gb"] == pytest.approx(8.0)
    direct = predict_workflow(wf, snapshot_from_card(card), resolver=resolver_of(root))
    assert body["p_success"] == direct["p_success"]
    missing = await answer(client, "POST", "/xpufleet/predict", 404, json={"workflow": wf, "worker": "gpu-box",
                                                                           "device": "cuda:9"})
    assert missing == {"error": "no card gpu-box/cuda:9"}  # the sidecar's answer passes through


CARDS = [
    {"worker": "gpu-box", "device": "cuda:0", "total_gib": 24.0, "free_gib": 6.0, "kind": "cuda",
     "uuid": "GPU-1111", "simulated": False, "ram_free_gib": 16.0, "commit_used_gib": 10.0, "commit_limit_gib": 40.0},
    {"worker": "gpu-box", "device": "cuda:1", "total_gib": 80.0, "free_gib": 78.0, "kind": "cuda",
     "uuid": "GPU-2222", "simulated": True},
    {"worker": "arc", "device": "xpu:0", "total_gib": 16.0, "free_gib": 15.0, "kind": "xpu", "uuid": None,
     "simulated": False, "ram_free_gib": 30.0, "commit_used_gib": 5.0, "commit_limit_gib": 60.0},
]


@pytest.fixture
async def sidecar(monkeypatch, tmp_path, sparse, xpufleet_home, aiohttp_client):
    """``(client, calls)``: the sidecar's predictor routes over :data:`CARDS` (``calls`` counts the reads of
    the cards) and an SD 3.5 large's models in XPUFLEET_MODEL_DIRS."""
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
    return await aiohttp_client(app), calls


async def test_sidecar_predict_on_a_worker_card(sidecar, template):
    client, calls = sidecar
    wf = template("sd3.5_large_canny_controlnet_example.json")
    out = {device: await answer(client, "POST", "/api/predict", json={"workflow": wf, "worker": worker,
                                                                      "device": device})
           for worker, device in (("gpu-box", "cuda:0"), ("gpu-box", "cuda:1"), ("arc", "xpu:0"))}
    out["own"] = await answer(client, "POST", "/api/predict", json={"workflow": wf})  # this machine's own device
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


async def test_sidecar_bad_card_requests(sidecar, template):
    client, _ = sidecar
    wf = template("sd3.5_large_canny_controlnet_example.json")
    body = await answer(client, "POST", "/api/predict", 404, json={"workflow": wf, "worker": "nope",
                                                                   "device": "cuda:0"})
    assert "known cards: gpu-box/cuda:0" in body["error"]
    body = await answer(client, "POST", "/api/predict", 400, json={"workflow": wf, "worker": "gpu-box"})
    assert "name both worker and device" in body["error"]
    await answer(client, "POST", "/api/predict", 400, json={"workflow": "x"})


async def test_sidecar_snapshot_route(sidecar):
    client, _ = sidecar
    body = await answer(client, "GET", "/api/snapshot")
    assert [c["device"] for c in body["cards"]] == ["cuda:0", "cuda:1", "xpu:0"]
    assert body["cards"][1]["simulated"] is True
    assert body["snapshot"]["source"] in {"none", "nvml", "torch", "torch+nvml"}
    card = (await answer(client, "GET", "/api/snapshot", params={"worker": "arc", "device": "xpu:0"}))["snapshot"]
    assert (card["vram_free_gb"], card["platform"], card["worker"]) == (15.0, "intel", "arc")
    await answer(client, "GET", "/api/snapshot", 404, params={"worker": "arc", "device": "xpu:9"})
