"""End to end (docs/workers.md): recorded node outputs kept on the worker, read back through the sidecar while the
worker is connected, 409 naming the worker while it is away, and with ``record_outputs: "upload"`` still
readable once the worker is gone. Real sidecar, real agent, real runs (iris, a small MLP)."""

from __future__ import annotations

import fleet_harness as fh
import pytest
import torch
from safetensors.torch import load

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def _check_outputs(sc: fh.SidecarProc, run_id: str, where: str) -> None:
    listing = sc.ok("GET", f"/api/runs/{run_id}/outputs")
    assert listing["where"] == where and listing["complete"] is True
    nodes = {n["node"]: n for n in listing["nodes"]}
    assert set(nodes) == {"1", "2", "4", "5", "6", "8", "9"}, nodes.keys()
    loop = sc.ok("GET", f"/api/runs/{run_id}/outputs/8")
    assert loop["class_type"] == "XPUTrainingLoop" and loop["where"] == where
    model, metrics = loop["outputs"]
    assert model["kind"] == "model" and model["file"].endswith(".safetensors") and model["parameters"] > 0
    assert metrics["kind"] == "metrics" and metrics["value"]["epochs_completed"] == 1
    assert metrics["value"]["final_train_loss"] > 0
    code, raw = sc.call("GET", f"/api/runs/{run_id}/outputs/8/{model['file']}", raw=True)
    assert code == 200
    weights = load(raw)
    assert weights and all(isinstance(t, torch.Tensor) for t in weights.values())
    assert sum(t.numel() for t in weights.values()) == model["parameters"]
    evaluate = sc.ok("GET", f"/api/runs/{run_id}/outputs/9")
    assert evaluate["outputs"][0]["kind"] == "metrics" and 0.0 <= evaluate["outputs"][0]["value"]["accuracy"] <= 1.0
    dataset = sc.ok("GET", f"/api/runs/{run_id}/outputs/1")
    assert [o["kind"] for o in dataset["outputs"]] == ["summary", "summary", "metrics"]
    assert dataset["outputs"][2]["value"]["num_classes"] == 3  # the dataset info, a JSON object
    code, body = sc.call("GET", f"/api/runs/{run_id}/outputs/8/../../secret")
    assert code == 404
    code, body = sc.call("GET", f"/api/runs/{run_id}/outputs/77")
    assert code == 404 and "no outputs for node '77'" in body["error"]


def test_recorded_outputs_stay_on_the_worker_and_upload_copies_them(fleet):
    sc = fleet.sidecar()
    agent = fleet.agent("--name", "keeper")
    agent.wait_connected()
    kept = sc.submit(fh.iris_graph(), target="keeper", record_outputs=True)
    uploaded = sc.submit(fh.iris_graph(), target="keeper", record_outputs="upload")
    plain = sc.submit(fh.iris_graph(), target="keeper")
    for rid in (kept, uploaded, plain):
        run = sc.wait_run(rid, {"succeeded", "failed"})
        assert run["status"] == "succeeded", run["error"]
    # kept on the worker: the files are in the agent's run folder, not on the sidecar
    agent_dir = fleet.home / "agents" / "keeper" / "runs" / kept / "recorded_outputs"
    assert (agent_dir / "index.json").is_file() and (agent_dir / "8" / "outputs.json").is_file()
    assert not (fleet.home / "runs" / kept / "recorded_outputs").exists()
    _check_outputs(sc, kept, "worker")
    # uploaded: a copy on the sidecar, said so in the run's facts
    facts = sc.run(uploaded)["execution_facts"]["recorded_outputs"]
    assert facts["uploaded"] is True and facts["kept_on"] == "keeper" and facts["bytes"] > 0
    _check_outputs(sc, uploaded, "sidecar")
    code, body = sc.call("GET", f"/api/runs/{plain}/outputs")
    assert code == 404 and "did not record its outputs" in body["error"]

    agent.stop()
    sc.wait_worker("keeper", "Disconnected")
    code, body = sc.call("GET", f"/api/runs/{kept}/outputs")
    assert code == 409 and "kept on worker keeper, which is not connected" in body["error"]
    code, body = sc.call("GET", f"/api/runs/{kept}/outputs/8")
    assert code == 409 and "keeper" in body["error"]
    _check_outputs(sc, uploaded, "sidecar")  # outlives the worker
    removed = fleet.cli("workers", "remove", "keeper")
    assert removed.returncode == 0, removed.stderr
    _check_outputs(sc, uploaded, "sidecar")
    # back again: readable from the worker once it is connected
    again = fleet.agent("--name", "keeper")
    again.wait_connected()
    _check_outputs(sc, kept, "worker")
    # deleting the run deletes the sidecar's copy
    assert sc.ok("DELETE", f"/api/runs/{uploaded}")["deleted"] == uploaded
    assert not (fleet.home / "runs" / uploaded).exists()


def test_a_local_run_records_its_outputs_on_the_sidecar(fleet):
    sc = fleet.sidecar()
    rid = sc.submit(fh.iris_graph(), record_outputs=True)
    run = sc.wait_run(rid, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    _check_outputs(sc, rid, "sidecar")
    events = sc.ok("GET", f"/api/runs/{rid}/events?limit=1000")["events"]
    (recorded,) = [e for e in events if e["type"] == "outputs_recorded"]
    assert recorded["payload"]["nodes"] == 7 and recorded["payload"]["bytes"] > 0
    code, body = sc.call("POST", "/api/runs", {"graph": fh.iris_graph(), "options": {"record_outputs": "yes"}})
    assert code == 400 and "options.record_outputs" in body["error"]
