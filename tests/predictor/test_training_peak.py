"""The capsule's peak for a training graph is the static estimate (the figure Queue on... suggests), the
plugin's own ModelSaver file is no unresolved model, and the answer carries the tooltip's sentence."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from xpufleet.predictor.estimate import estimate_graph
from xpufleet.predictor.service import predict_workflow
from xpufleet.predictor.snapshot import Snapshot
from xpufleet.server.ledger.budget import suggest

ROOT = Path(__file__).resolve().parents[2]
API = json.loads((ROOT / "samples" / "mlp_digits.json").read_text())
UI = json.loads((ROOT / "example_workflows" / "mlp_digits.json").read_text())
CARD = Snapshot(vram_free_gb=23.9, vram_total_gb=24.0, ram_free_gb=30.0, commit_used_gb=10.0, commit_limit_gb=60.0,
                device="cuda:0", kind="cuda", platform="nvidia", worker="gpu-box", simulated=True)


def test_peak_is_the_static_estimate_queue_on_suggests():
    expected = estimate_graph(API).total_gib
    assert expected and expected > 0
    assert suggest(API, None, estimate=estimate_graph).total_gib == expected  # what the Queue on... dialog shows
    for answer in (predict_workflow(API, CARD), predict_workflow(UI, CARD, prompt=API)):
        assert answer["explanation"]["inputs"]["m_peak_gb"] == pytest.approx(expected)
        assert answer["explanation"]["models"]["training_estimate"]["total_gib"] == pytest.approx(expected)
        assert answer["summary"]["peak_source"] == "training_estimate"


def test_own_output_file_is_not_an_unresolved_model():
    answer = predict_workflow(UI, CARD, prompt=API)
    assert answer["complete"] is True
    assert not [m for m in answer["models"] if m["status"] != "found"]


def test_summary_fields_name_the_device():
    s = predict_workflow(UI, CARD, prompt=API)["summary"]
    assert s["verdict"] == "fits"
    assert (s["worker"], s["device"], s["simulated"], s["memory"]) == ("gpu-box", "cuda:0", True, "vram")
    assert s["of_gb"] == 24.0 and s["need_gb"] > 0
    small = Snapshot(vram_free_gb=0.01, vram_total_gb=0.02, ram_free_gb=0.05, commit_used_gb=1, commit_limit_gb=1.01,
                     device="cuda:0", kind="cuda", platform="nvidia")
    wide = json.loads(json.dumps(API))
    wide["4"]["inputs"]["hidden"] = "2048,2048"  # above the formula's 0.1 GB floor of the effective VRAM
    tiny = predict_workflow(wide, small)["summary"]
    assert tiny["need_gb"] > 0.1 and tiny["verdict"] in ("spills", "fails")


def test_on_a_cpu_the_sentence_counts_the_free_ram():
    cpu = Snapshot(ram_free_gb=12.5, commit_used_gb=4.0, commit_limit_gb=40.0, device="cpu", kind="cpu", platform="cpu")
    s = predict_workflow(API, cpu)["summary"]
    assert (s["memory"], s["of_gb"], s["worker"], s["device"]) == ("ram", 12.5, None, "cpu")


def test_ui_workflow_alone_has_no_training_estimate():
    answer = predict_workflow(UI, CARD)
    assert "training_estimate" not in answer["explanation"]["models"]
    # no model file and no estimate: its 0 GiB is no size of anything (test_predictor_missing.py)
    assert answer["summary"]["peak_source"] == "none"


def test_prompt_must_be_api_format():
    with pytest.raises(ValueError, match="prompt"):
        predict_workflow(UI, CARD, prompt=UI)


async def test_the_predict_route_takes_the_prompt_beside_the_workflow(aiohttp_client):
    """``POST /api/predict`` with ``prompt``: the answer's peak is the estimate; a bad prompt is a 400."""
    from aiohttp import web

    from xpufleet.server.sidecar.routes.predictor import add_sidecar_routes

    card = {"worker": "gpu-box", "device": "cuda:0", "total_gib": 24.0, "free_gib": 23.9, "kind": "cuda",
            "uuid": None, "simulated": True}
    app = web.Application()
    add_sidecar_routes(app, lambda: [dict(card)])
    client = await aiohttp_client(app)
    body = {"workflow": UI, "prompt": API, "worker": "gpu-box", "device": "cuda:0"}
    ok = await client.post("/api/predict", json=body)
    resp = await client.post("/api/predict", json={**body, "prompt": UI})
    status, answer, bad_status, bad = ok.status, await ok.json(), resp.status, await resp.json()
    assert status == 200 and answer["summary"]["peak_source"] == "training_estimate"
    assert answer["summary"]["worker"] == "gpu-box" and answer["summary"]["of_gb"] == 24.0
    assert bad_status == 400 and "prompt" in bad["error"]
