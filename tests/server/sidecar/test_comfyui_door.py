"""The door of ComfyUI runs (docs/comfyui.md), with a real in-process sidecar and an agent speaking the
protocol by hand (no ComfyUI is started): a worker announcing a ComfyUI is ``probing`` until its ``comfyui``
message; a run for it waits meanwhile, then starts; unknown classes, missing files and bad COMBO values are
400s naming the worker, node and file; ``any`` takes only the worker whose ComfyUI can run the workflow;
``local`` without a ComfyUI and a worker without one are refused."""

from __future__ import annotations

import copy
from typing import Any

import scripted_agent as sa

from xpufleet.constants import AGENT_CAP_MEMORY

from ..comfyflow.readings import core_workflow, message, upscale_workflow


async def comfy_agent(sc: sa.Sidecar, name: str, n_cards: int = 2) -> sa.ScriptedAgent:
    """An agent started with --comfyui: its hello announces a ComfyUI; its reading is sent by the test."""
    return await sc.agent(name, sa.cards(n_cards, prefix=f"GPU-{name}"), caps=False,
                          capabilities=[AGENT_CAP_MEMORY, "comfyui"])


async def post(sc: sa.Sidecar, graph: dict[str, Any], **options: Any) -> tuple[int, Any]:
    return await sc.call("POST", "/api/runs", {"graph": graph, "options": options})


async def test_a_probing_worker_makes_runs_wait_then_its_reading_lets_them_start(tmp_path) -> None:
    async with sa.Sidecar(tmp_path) as sc:
        box = await comfy_agent(sc, "gpu-box")
        assert (await sc.worker("gpu-box"))["comfyui"] == {"state": "probing", "version": None, "classes": 0,
                                                          "error": None}
        code, named = await post(sc, core_workflow(), target="gpu-box", device="cuda:0")
        assert code == 201, named
        code, anyrun = await post(sc, core_workflow(), target="any", device="cuda")
        assert code == 201, anyrun
        await sc.reason(named["run_id"], "worker gpu-box is still reading its ComfyUI")
        await sc.reason(anyrun["run_id"], "worker gpu-box is still reading its ComfyUI")
        run = await sc.run(named["run_id"])
        assert run["kind"] == "comfyui" and run["status"] == "queued"

        await box.send("comfyui", **message())
        started = {(await box.recv_type("start_run"))["run_id"] for _ in range(2)}
        assert started == {named["run_id"], anyrun["run_id"]}
        shown = (await sc.worker("gpu-box"))["comfyui"]
        assert shown["state"] == "ready" and shown["version"] == "0.3.64" and shown["classes"] == 6


async def test_refusals_name_the_worker_node_file_and_what_to_do(tmp_path) -> None:
    async with sa.Sidecar(tmp_path) as sc:
        box = await comfy_agent(sc, "gpu-box")
        await box.send("comfyui", **message())
        await sc.until(lambda: _state(sc, "gpu-box", "ready"), "gpu-box ready")

        foo = core_workflow()
        foo["7"] = {"class_type": "FooNode", "inputs": {}}
        code, body = await post(sc, foo, target="gpu-box")
        assert code == 400 and body["error"] == (
            "worker gpu-box has no node class 'FooNode' (node 7): install the custom node that provides it in that "
            "worker's ComfyUI (custom_nodes/) and restart its agent, or choose another target")

        code, body = await post(sc, upscale_workflow("x4.safetensors"), target="gpu-box")
        assert code == 400 and body["error"] == (
            "worker gpu-box has no model file 'x4.safetensors' in models/upscale_models (node 2, "
            "UpscaleModelLoader.model_name): put it there, or choose another target")

        combo = copy.deepcopy(core_workflow())
        combo["2"]["inputs"]["crop"] = "sideways"
        code, body = await post(sc, combo, target="gpu-box")
        assert code == 400 and "node 2 (ImageScale) input 'crop' is 'sideways'" in body["error"]
        assert "it offers 'disabled', 'center'" in body["error"]

        code, body = await post(sc, upscale_workflow(), target="gpu-box")  # the file is there: queued
        assert code == 201, body

        code, body = await post(sc, core_workflow(), target="local")
        assert code == 400 and body["error"] == (
            "this server has no ComfyUI to run workflows: start the sidecar with --comfyui PATH, or queue to a "
            "worker started with --comfyui")
        code, listed = await sc.call("GET", "/api/runs")
        assert code == 200 and len(listed["runs"]) == 1  # nothing stored for the refusals


async def test_any_takes_only_the_worker_that_can_run_the_whole_workflow(tmp_path) -> None:
    async with sa.Sidecar(tmp_path) as sc:
        plain = await sc.agent("plain", sa.cards(2, prefix="GPU-plain"))
        bare = await comfy_agent(sc, "bare")
        full = await comfy_agent(sc, "full")
        await bare.send("comfyui", **message(models={"upscale_models": []}))  # no upscale model there
        await full.send("comfyui", **message())
        await sc.until(lambda: _state(sc, "full", "ready"), "full ready")
        await sc.until(lambda: _state(sc, "bare", "ready"), "bare ready")

        code, body = await post(sc, core_workflow(), target="plain")
        assert code == 400 and body["error"] == ("worker plain has no ComfyUI to run workflows: start its agent "
                                                 "with --comfyui PATH (the ComfyUI folder)")
        ids = []
        for _ in range(2):
            code, body = await post(sc, upscale_workflow(), target="any", device="cuda")
            assert code == 201, body
            ids.append(body["run_id"])
        for _ in ids:
            await full.recv_type("start_run")
        for rid in ids:
            run = await sc.run(rid)
            assert run["worker_id"] == "full" and run["kind"] == "comfyui", run
        assert plain and bare

        code, body = await post(sc, upscale_workflow("x9.pth"), target="any", device="cuda")
        assert code == 400
        assert body["error"].startswith("no worker seen since the server started can run this workflow on cuda: ")
        assert "worker bare has no model file 'x9.pth' in models/upscale_models" in body["error"]
        assert "worker plain has no ComfyUI to run workflows" in body["error"]


async def _state(sc: sa.Sidecar, name: str, state: str) -> bool:
    return (await sc.worker(name))["comfyui"]["state"] == state


async def test_a_run_waiting_for_a_reading_that_cannot_run_it_fails_with_the_check_s_text(tmp_path) -> None:
    async with sa.Sidecar(tmp_path) as sc:
        box = await comfy_agent(sc, "gpu-box")
        code, body = await post(sc, upscale_workflow(), target="gpu-box")
        assert code == 201, body
        await box.send("comfyui", **message(models={"upscale_models": []}))
        run = await sc.status(body["run_id"], {"failed"})
        assert run["error"] == ("the run can no longer be placed: worker gpu-box has no model file 'x2.safetensors' "
                                "in models/upscale_models (node 2, UpscaleModelLoader.model_name): put it there, or "
                                "choose another target")
        await box.send("comfyui", ok=False, error="ComfyUI did not answer on 127.0.0.1:8190 within 60 s")
        await sc.until(lambda: _state(sc, "gpu-box", "failed"), "gpu-box failed")
        code, body = await post(sc, core_workflow(), target="gpu-box")
        assert code == 400 and body["error"] == (
            "worker gpu-box could not read its ComfyUI (ComfyUI did not answer on 127.0.0.1:8190 within 60 s): fix "
            "it and restart its agent, or choose another target")


async def test_a_pool_takes_comfyui_runs_when_it_declares_a_comfyui_and_checks_each_instance(tmp_path) -> None:
    async with sa.Sidecar(tmp_path) as sc:
        code, plain = await sc.call("POST", "/api/pools", {"name": "plain"})
        assert code == 201, plain
        code, burst = await sc.call("POST", "/api/pools", {"name": "burst", "comfyui": "/opt/ComfyUI"})
        assert code == 201 and "--comfyui /opt/ComfyUI" in burst["command"], burst
        code, body = await post(sc, core_workflow(), target={"pool": "plain"})
        assert code == 400 and body["error"].startswith("pool 'plain' runs no ComfyUI workflows")
        code, waiting = await post(sc, core_workflow(), target={"pool": "burst"})
        assert code == 201, waiting
        await sc.reason(waiting["run_id"], "burst")

        inst = sa.ScriptedAgent(sc, "burst-1", sa.cards(1, prefix="GPU-b1"), caps=False, one_shot=True,
                                auth={"kind": "pool", "token": burst["credential"]},
                                capabilities=[AGENT_CAP_MEMORY, "comfyui"])
        assert (await inst.connect())["type"] == "welcome"
        await sc.reason(waiting["run_id"], "worker burst-1 is still reading its ComfyUI")
        await inst.send("comfyui", **message())
        start = await inst.recv_type("start_run")
        assert start["run_id"] == waiting["run_id"]
        code, listed = await sc.call("GET", "/api/pools/burst")
        assert code == 200 and listed["comfyui"] == "/opt/ComfyUI"


async def test_this_server_with_a_comfyui_runs_workflows_once_it_is_read(tmp_path) -> None:
    from xpufleet.constants import LOCAL_PROVIDER

    async with sa.Sidecar(tmp_path) as sc:
        local = sc.dispatcher.providers[LOCAL_PROVIDER]
        local.comfyui_probing()
        sc.dispatcher.providers_changed()
        code, body = await post(sc, core_workflow(), target="local")
        assert code == 201, body
        await sc.reason(body["run_id"], "this server is still reading its ComfyUI")
        local.comfyui_read(message())
        sc.dispatcher.providers_changed()
        run = await sc.status(body["run_id"], {"assigned", "running", "failed", "succeeded"})
        assert run["placement"] == "local" and run["kind"] == "comfyui"
        foo = core_workflow()
        foo["9"] = {"class_type": "FooNode", "inputs": {}}
        code, body = await post(sc, foo, target="local")
        assert code == 400 and body["error"].startswith("this server has no node class 'FooNode' (node 9): install "
                                                        "the custom node that provides it in this server's ComfyUI")


async def test_a_waiting_any_run_survives_a_restart_and_starts_once_a_worker_s_reading_allows(tmp_path) -> None:
    sc = sa.Sidecar(tmp_path)
    await sc.__aenter__()
    try:
        await comfy_agent(sc, "gpu-box")
        code, body = await post(sc, core_workflow(), target="any", device="cuda")
        assert code == 201, body
        await sc.reason(body["run_id"], "still reading its ComfyUI")
    finally:
        await sc.close()
    async with sa.Sidecar(tmp_path) as again:
        await again.reason(body["run_id"], "waiting for the workers to reconnect after the server's restart")
        box = await comfy_agent(again, "gpu-box")
        await box.send("comfyui", **message())
        start = await box.recv_type("start_run")
        assert start["run_id"] == body["run_id"]


async def test_a_named_run_waiting_for_a_reading_survives_a_restart(tmp_path) -> None:
    sc = sa.Sidecar(tmp_path)
    await sc.__aenter__()
    try:
        await comfy_agent(sc, "gpu-box")
        code, body = await post(sc, core_workflow(), target="gpu-box", device="cuda:1")
        assert code == 201, body
        await sc.reason(body["run_id"], "still reading its ComfyUI")
    finally:
        await sc.close()
    async with sa.Sidecar(tmp_path) as again:
        await again.reason(body["run_id"], "unknown worker 'gpu-box'")
        box = await comfy_agent(again, "gpu-box")
        await again.reason(body["run_id"], "worker gpu-box is still reading its ComfyUI")
        await box.send("comfyui", **message())
        start = await box.recv_type("start_run")
        assert start["run_id"] == body["run_id"] and start["devices"] == ["cuda:1"]
