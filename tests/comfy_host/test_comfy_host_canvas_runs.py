"""Canvas runs in a real ComfyUI (docs/canvas-runs.md): a prompt queued as the front end queues it (POST /prompt,
ComfyUI executes it in its own process) is recorded on the sidecar of ComfyUI's XPUFLEET_HOME as a run with
source canvas, with its metric series and ComfyUI's own end (success, a node's error, an interruption); a
cancel on the sidecar interrupts ComfyUI's prompt; with no sidecar nothing is sent and ComfyUI logs nothing
of it."""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import pytest
import sidecar_harness  # registered by tests/comfy_host/conftest.py

pytestmark = pytest.mark.comfy

SAMPLES = Path(__file__).resolve().parents[2] / "samples"
WAIT_S = 120.0


def mlp(epochs: int = 2, seed: int = 0) -> dict[str, Any]:
    graph = json.loads((SAMPLES / "mlp_digits.json").read_text())
    graph["8"]["inputs"].update(epochs=epochs, seed=seed, checkpoint_every=0, tensorboard=False)
    graph["10"]["inputs"]["filename"] = "models/canvas_runs_test.safetensors"
    return graph


def canvas_run(sidecar, prompt_id: str, status: str | None = None) -> dict[str, Any]:
    """The canvas run of ComfyUI's prompt (once it has ``status``), bounded by WAIT_S."""
    deadline, found = time.monotonic() + WAIT_S, None
    while time.monotonic() < deadline:
        runs = sidecar.client.request("GET", "/api/runs", params={"source": "canvas", "limit": 200})["runs"]
        found = next((r for r in runs if r["execution_facts"].get("comfy_prompt_id") == prompt_id), None)
        if found is not None and (status is None or found["status"] == status):
            return found
        time.sleep(0.1)  # the plugin posts every CANVAS_FLUSH_S; the sidecar has no push channel for a list
    raise AssertionError(f"no canvas run of prompt {prompt_id} with status {status} within {WAIT_S} s: {found}")


def test_with_no_sidecar_a_canvas_run_sends_nothing_and_logs_nothing(comfyui):
    assert not (comfyui.home / "runtime.json").exists()
    before = len(comfyui.log())
    run = comfyui.run_prompt(mlp(epochs=1, seed=11))
    assert run.succeeded, json.dumps(run.history["status"])[:2000]
    said = comfyui.log()[before:]
    assert "recorded on the sidecar" not in said and "xpufleet: " not in said, said
    ours = [t for t in tracebacks(said) if "custom_nodes/xpufleet" in t or str(SAMPLES.parent) in t]
    assert ours == []  # ComfyUI logs tracebacks of its own (its in-memory database across threads)


def tracebacks(log: str) -> list[str]:
    """Each traceback in ``log``: its indented frames and the exception line that ends it."""
    found, current = [], None
    for line in log.splitlines():
        if line.startswith("Traceback (most recent call last)"):
            current = [line]
        elif current is not None:
            current.append(line)
            if line and not line[0].isspace():
                found.append("\n".join(current))
                current = None
    return found


@pytest.fixture(scope="module")
def sidecar(comfyui):
    """A sidecar for ComfyUI's XPUFLEET_HOME: the plugin finds it through the runtime file there."""
    started = sidecar_harness.Sidecar(comfyui.home).start()
    try:
        yield started
    finally:
        started.stop()


def test_a_canvas_run_is_listed_with_source_canvas_its_series_and_comfyuis_end(comfyui, sidecar):
    run = comfyui.run_prompt(mlp(epochs=3, seed=21))
    assert run.succeeded, json.dumps(run.history["status"])[:2000]
    recorded = canvas_run(sidecar, run.prompt_id, "succeeded")
    trained = run.metrics("8")
    assert (recorded["source"], recorded["placement"], recorded["error"]) == ("canvas", "canvas", None)
    assert recorded["name"].startswith("ComfyUI prompt ")
    assert recorded["finished_at"] >= recorded["started_at"]
    assert recorded["final_metrics"]["val_accuracy"] == pytest.approx(trained["final_val_accuracy"])
    assert recorded["final_metrics"]["eval_accuracy"] == pytest.approx(run.metrics("9")["accuracy"])
    one = sidecar.client.run(recorded["id"])
    assert one["graph"]["8"]["inputs"]["epochs"] == 3  # the prompt ComfyUI ran
    series = sidecar.client.request("GET", f"/api/runs/{recorded['id']}/metrics")["metrics"]
    chart = run.outputs["8"]["curve"][0]["train_loss_batch"]  # the node's own chart: the same points
    assert [[p["step"], p["value"]] for p in series["train_loss_batch"]] == [[s, pytest.approx(v)] for s, v in chart]
    assert [p["epoch"] for p in series["val_accuracy"]] == [1, 2, 3]
    events = sidecar.client.events(recorded["id"], limit=1000)["events"]
    saved = [e["payload"]["path"] for e in events if e["type"] == "artifact"]
    assert saved == [run.outputs["10"]["text"][0]]
    assert any(e["type"] == "progress" and e["payload"]["value"] == e["payload"]["max"] for e in events)
    # the CLI lists it as the API does: `xpufleet runs --source canvas`
    table = sidecar.cli("runs", "--source", "canvas", check=True).stdout.splitlines()
    row = next(line for line in table if line.startswith(recorded["id"][:8]))
    assert "succeeded" in row and "ComfyUI canvas" in row and recorded["name"][:24] in row
    assert recorded["id"][:8] not in sidecar.cli("runs", "--source", "api", check=True).stdout


def test_a_node_error_fails_the_canvas_run_with_comfyuis_message(comfyui, sidecar):
    graph = mlp(epochs=1, seed=31)
    graph["10"]["inputs"].update(overwrite=False, filename="models/canvas_runs_test.safetensors")
    (comfyui.base / "output" / "xpufleet" / "models").mkdir(parents=True, exist_ok=True)
    (comfyui.base / "output" / "xpufleet" / "models" / "canvas_runs_test.safetensors").write_bytes(b"x")
    run = comfyui.run_prompt(graph)
    assert not run.succeeded
    recorded = canvas_run(sidecar, run.prompt_id, "failed")
    assert recorded["error"].startswith("XPUModelSaver (node 10): ModelSaver: ")
    assert "overwrite is off" in recorded["error"]


def test_a_cancel_on_the_sidecar_interrupts_comfyuis_prompt(comfyui, sidecar):
    graph = mlp(epochs=100_000, seed=41)  # trains until stopped

    async def cancel_once_recorded(event, session):
        if event["type"] == "progress" and not getattr(cancel_once_recorded, "sent", False):
            cancel_once_recorded.sent = True
            found = canvas_run(sidecar, event["data"]["prompt_id"])
            sidecar.client.cancel(found["id"], "from the Runs panel")

    run = comfyui.run_prompt(graph, on_event=cancel_once_recorded)
    assert "execution_interrupted" in run.messages and "execution_error" not in run.messages, run.history["status"]
    recorded = canvas_run(sidecar, run.prompt_id, "cancelled")
    assert recorded["error"] == "cancelled in ComfyUI" and recorded["cancel_requested"] is True
    assert_interrupt_checkpoint(sidecar, recorded)


def test_comfyuis_own_interrupt_ends_the_canvas_run_cancelled(comfyui, sidecar):
    graph = copy.deepcopy(mlp(epochs=100_000, seed=51))

    async def interrupt_once_recorded(event, session):
        if event["type"] == "progress" and not getattr(interrupt_once_recorded, "sent", False):
            interrupt_once_recorded.sent = True
            canvas_run(sidecar, event["data"]["prompt_id"])
            async with session.post("/interrupt", json={}) as resp:
                assert resp.status == 200

    run = comfyui.run_prompt(graph, on_event=interrupt_once_recorded)
    # ComfyUI shows an interruption, not a node error (on 0.33 its interrupt is a BaseException)
    interrupted = run.messages.get("execution_interrupted")
    assert interrupted is not None and interrupted["node_id"] == "8", run.history["status"]
    assert "execution_error" not in run.messages
    recorded = canvas_run(sidecar, run.prompt_id, "cancelled")
    assert recorded["cancel_requested"] is False and recorded["error"] == "cancelled in ComfyUI"
    assert_interrupt_checkpoint(sidecar, recorded)


def assert_interrupt_checkpoint(sidecar, recorded: dict[str, Any]) -> None:
    """The cancelled run lists the interrupt checkpoint the training loop wrote before it stopped."""
    events = sidecar.client.events(recorded["id"], limit=1000)["events"]
    checkpoints = [e["payload"]["path"] for e in events if e["type"] == "artifact"
                   and e["payload"]["path"].endswith("interrupt.pt")]
    assert len(checkpoints) == 1 and Path(checkpoints[0]).is_file(), events[-5:]
    said = [e["payload"]["message"] for e in events if e["type"] == "log"]
    assert any("stopped at epoch" in m and "interrupt checkpoint" in m for m in said), said


def test_the_page_names_a_prompts_run_through_comfyuis_server(comfyui, sidecar):
    assert comfyui.request("POST", "/xpufleet/canvas/name", {"prompt_id": "p", "name": ""}) == (
        400, {"error": "name: must be a workflow name of 1-200 characters"})
    assert comfyui.request("POST", "/api/xpufleet/canvas/name", {"prompt_id": "p", "extra": 1})[0] == 400

    named = {}

    async def name_at_start(event, session):  # what the page does at execution_start (web/lib/canvas_nodes.mjs)
        if event["type"] == "execution_start" and not named:
            named["id"] = event["data"]["prompt_id"]
            # the page's fetchApi carries the guard's header (web/lib/pairing.mjs installPairing)
            async with session.post("/api/xpufleet/canvas/name", json={"prompt_id": named["id"], "name": "my graph"},
                                    headers={"X-XPUFleet-Request": "1"}) as r:
                assert r.status == 200, await r.text()

    run = comfyui.run_prompt(mlp(epochs=1, seed=61), on_event=name_at_start)
    assert run.succeeded and named["id"] == run.prompt_id
    assert canvas_run(sidecar, run.prompt_id, "succeeded")["name"] == "my graph"
