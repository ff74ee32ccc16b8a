"""A ComfyUI workflow's static estimate (server/sidecar/workflow_estimate.py): M_peak from the sizes of the
files this machine's model folders hold; none when a file is missing or none is loaded. Then the budget a
run gets on a card shared by memory, and what the Queue on... dialog suggests."""

from __future__ import annotations

import scripted_agent as sa

from xpufleet.constants import AGENT_CAP_MEMORY
from xpufleet.server.sidecar.workflow_estimate import estimate_workflow, workflow_peak_gib

from ..comfyflow.readings import core_workflow, message, upscale_workflow

GIB = 1024**3


def models(tmp_path, monkeypatch, size: int = GIB // 4):
    root = tmp_path / "models"
    (root / "upscale_models").mkdir(parents=True)
    with open(root / "upscale_models" / "x2.safetensors", "wb") as f:
        f.truncate(size)  # sparse: its size is what counts
    monkeypatch.setenv("XPUFLEET_MODEL_DIRS", str(root))
    return root


def test_m_peak_of_the_files_found_here(tmp_path, monkeypatch) -> None:
    models(tmp_path, monkeypatch)
    est = estimate_workflow(upscale_workflow())
    assert est.total_gib == 0.25 and not est.rough
    assert est.items[0].label == "M_peak: the largest model file the workflow loads (x2.safetensors)"


def test_no_figure_for_a_missing_file_or_a_workflow_without_files(tmp_path, monkeypatch) -> None:
    models(tmp_path, monkeypatch)
    est = estimate_workflow(upscale_workflow("x4.safetensors"))
    assert est.total_gib is None and "model file 'x4.safetensors' (node 2, UpscaleModelLoader)" in est.reasons[0]
    assert workflow_peak_gib(core_workflow()) is None


async def test_a_shared_card_gets_the_estimate_as_the_budget(tmp_path, monkeypatch) -> None:
    models(tmp_path, monkeypatch)
    async with sa.Sidecar(tmp_path / "home") as sc:
        box = await sc.agent("gpu-box", sa.cards(1, prefix="GPU-box"), caps=False,
                             capabilities=[AGENT_CAP_MEMORY, "comfyui"], share=("cuda:0",))
        await box.send("comfyui", **message())
        code, body = await sc.call("POST", "/api/estimates", {"graph": upscale_workflow(),
                                                              "options": {"target": "gpu-box", "device": "cuda:0"}})
        assert code == 200 and body["source"] == "estimate" and body["budget_gib"] == 0.25, body
        code, body = await sc.call("POST", "/api/runs", {"graph": upscale_workflow(),
                                                         "options": {"target": "gpu-box", "device": "cuda:0"}})
        assert code == 201, body
        run = await sc.run(body["run_id"])
        assert run["budget_gib"] == 0.25 and run["budget_source"] == "estimate", run
        code, body = await sc.call("POST", "/api/runs", {"graph": core_workflow(),
                                                         "options": {"target": "gpu-box", "device": "cuda:0"}})
        assert code == 400 and "set options.target.memory_gib" in body["error"]
