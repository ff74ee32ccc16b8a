"""End to end (docs/workers.md, "Any workflow on a fleet card"): ComfyUI workflows queued to a worker's
(simulated) cards run in a warm headless copy of the real ComfyUI there. For the module: one sidecar (with
``--comfyui`` too, for "this server"), an agent ``box`` with two simulated cards whose ComfyUI sees a tiny
upscale model the test writes, and an agent ``bare`` with one card whose ComfyUI does not (each ComfyUI
start costs ~10 s on 2 cores). The tests run in order and share the instances: a named card (cold), the same
workflow again (warm), ``any`` (and a workflow only box can run goes there), the model file (progress), "this
server", a node that raises, a cancel, kill -9 of the instance during a run (then a fresh instance), the
door's refusals against the real readings (a model file bare lacks, a node class no worker has), a fan-out
of 8 seeds over box's 2 cards, and a one-shot pool whose instance runs one workflow and exits.

Needs the real ComfyUI (COMFYUI_DIR, COMFYUI_PYTHON); skipped with the reason without it."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import comfy_harness
import fleet_harness as fh
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.comfy, pytest.mark.timeout(300)]

WORKER = "box"
BARE = "bare"
UPSCALER = "tiny-compact-2x.safetensors"


def image_graph(color: int, size: int = 96) -> dict[str, Any]:
    """EmptyImage -> ImageScale -> SaveImage: core nodes, no weights."""
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": color}},
        "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "bilinear",
                                                     "width": size, "height": size, "crop": "disabled"}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "fleet"}},
    }


def slow_graph(color: int, steps: int = 24) -> dict[str, Any]:
    """A chain of big lanczos rescales (~0.4 s each on CPU): a run of several seconds, stoppable between nodes."""
    graph: dict[str, Any] = {"1": {"class_type": "EmptyImage",
                                   "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": color}}}
    prev = "1"
    for i in range(steps):
        node = str(10 + i)
        side = 2600 + (i % 2) * 64
        graph[node] = {"class_type": "ImageScale", "inputs": {"image": [prev, 0], "upscale_method": "lanczos",
                                                             "width": side, "height": side, "crop": "disabled"}}
        prev = node
    graph["99"] = {"class_type": "ImageScale", "inputs": {"image": [prev, 0], "upscale_method": "bilinear",
                                                         "width": 32, "height": 32, "crop": "disabled"}}
    graph["100"] = {"class_type": "SaveImage", "inputs": {"images": ["99", 0], "filename_prefix": "slow"}}
    return graph


def raising_graph() -> dict[str, Any]:
    """RegexReplace with a pattern that passes validation (any string) and raises when run."""
    return {
        "1": {"class_type": "RegexReplace", "inputs": {"string": "abc", "regex_pattern": "(", "replace": "x"}},
        "2": {"class_type": "PreviewAny", "inputs": {"source": ["1", 0]}},
    }


@pytest.fixture(scope="module")
def comfy_fleet(tmp_path_factory):
    found = comfy_harness.configured()
    if found is None:
        pytest.skip(comfy_harness.SKIP_REASON)
    comfy_dir, python = found
    fleet = fh.Fleet(tmp_path_factory.mktemp("comfy-fleet"))
    models = tiny_upscale_models(fleet.tmp / "models")
    try:
        sc = fleet.sidecar("--comfyui", str(comfy_dir), "--comfyui-python", str(python))  # "this server" too
        agent = fleet.agent("--name", WORKER, "--simulate", "cuda:0=24,cuda:1=24", "--comfyui", str(comfy_dir),
                            "--comfyui-python", str(python),
                            env=fleet.env(XPUFLEET_COMFYUI_ARGS=f"--extra-model-paths-config {models}"))
        # a second worker whose ComfyUI lacks the test's model file (no extra model paths)
        bare = fleet.agent("--name", BARE, "--simulate", "cuda:0=24", "--comfyui", str(comfy_dir),
                           "--comfyui-python", str(python), label="bare")
        agent.wait_connected()
        bare.wait_connected()
        yield fleet, sc, agent
    finally:
        fleet.close()
        leftovers = comfy_pids(fleet.home)
        for pid in leftovers:  # never leave a ComfyUI behind, even when the agent failed to stop it
            os.kill(pid, signal.SIGKILL)
        assert not leftovers, f"the agent left ComfyUI instances running: {leftovers}"


def tiny_upscale_models(folder: Path) -> Path:
    """A RealESRGAN-compact 2x upscale model of a few hundred weights (spandrel detects it from its keys) in
    ``folder/upscale_models``, and the extra model paths file that shows it to the worker's ComfyUI."""
    import torch
    from safetensors.torch import save_file

    torch.manual_seed(0)
    nf, out = 4, 3 * 2 * 2  # 4 features; 3 channels x scale 2 squared (pixel shuffle)
    state = {"body.0.weight": torch.randn(nf, 3, 3, 3) * 0.1, "body.0.bias": torch.zeros(nf),
             "body.1.weight": torch.full((nf,), 0.25), "body.2.weight": torch.randn(nf, nf, 3, 3) * 0.1,
             "body.2.bias": torch.zeros(nf), "body.3.weight": torch.full((nf,), 0.25),
             "body.4.weight": torch.randn(out, nf, 3, 3) * 0.1, "body.4.bias": torch.zeros(out)}
    (folder / "upscale_models").mkdir(parents=True)
    save_file(state, str(folder / "upscale_models" / UPSCALER))
    config = folder / "extra_model_paths.yaml"
    config.write_text(f"fleet_test:\n    base_path: {folder}\n    upscale_models: upscale_models\n")
    return config


def upscale_graph() -> dict[str, Any]:
    """A workflow that loads a model file: EmptyImage -> ImageUpscaleWithModel (4 tiles: progress) -> SaveImage."""
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 600, "height": 600, "batch_size": 1, "color": 99}},
        "2": {"class_type": "UpscaleModelLoader", "inputs": {"model_name": UPSCALER}},
        "3": {"class_type": "ImageUpscaleWithModel", "inputs": {"upscale_model": ["2", 0], "image": ["1", 0]}},
        "4": {"class_type": "SaveImage", "inputs": {"images": ["3", 0], "filename_prefix": "up"}},
    }


def comfy_pids(home: Path) -> list[int]:
    """The pids of live ComfyUI processes whose command line names this test's home (by /proc, no names)."""
    marker = str(home / "comfyui")
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "main.py" in cmdline and marker in cmdline:
            out.append(int(entry.name))
    return out


def run_spec(fleet: fh.Fleet, run_id: str) -> dict[str, Any]:
    return json.loads((fleet.home / "agents" / WORKER / "runs" / run_id / "spec.json").read_text())


def facts_of(run: dict[str, Any]) -> dict[str, Any]:
    return (run.get("execution_facts") or {}).get("comfyui") or {}


def check_image(sc: fh.SidecarProc, run_id: str) -> dict[str, Any]:
    listing = sc.ok("GET", f"/api/runs/{run_id}/outputs")
    nodes = {n["node"]: n for n in listing["nodes"]}
    assert "3" in nodes, listing
    node = sc.ok("GET", f"/api/runs/{run_id}/outputs/3")
    (image,) = node["outputs"]
    assert image["kind"] == "image" and image["media_type"] == "image/png" and image["bytes"] > 0, node
    code, raw = sc.call("GET", f"/api/runs/{run_id}/outputs/3/{image['file']}", raw=True)
    assert code == 200 and raw[:8] == b"\x89PNG\r\n\x1a\n" and len(raw) == image["bytes"]
    return image


def test_a_workflow_queued_to_a_named_card_runs_there_and_its_image_comes_back(comfy_fleet):
    fleet, sc, _ = comfy_fleet
    rid = sc.submit(image_graph(11), target={"worker": WORKER, "devices": ["cuda:1"]}, record_outputs="upload")
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=150)
    assert run["status"] == "succeeded", run["error"]
    facts = facts_of(run)
    assert facts["instance"] == "cuda:1" and facts["cold_start"] is True and facts["version"] == "0.3.64"
    assert run["execution_facts"]["run_kind"] == "comfyui"
    spec = run_spec(fleet, rid)
    assert spec["kind"] == "comfyui" and spec["comfyui"]["devices"] == ["cuda:1"]
    assert "/comfyui/box/cuda_1/" in spec["comfyui"]["output_dir"]
    events = sc.events(rid)
    started = [e["payload"] for e in events if e["type"] == "node_started"]
    assert [(p["node"], p["class_type"]) for p in started] == [("1", "EmptyImage"), ("2", "ImageScale"),
                                                               ("3", "SaveImage")]
    (output,) = [e["payload"] for e in events if e["type"] == "comfy_output"]
    assert output["node"] == "3" and output["files"][0]["kind"] == "image"
    check_image(sc, rid)


def test_the_second_run_of_a_workflow_finds_its_instance_warm(comfy_fleet):
    _, sc, _ = comfy_fleet
    rid = sc.submit(image_graph(12), target={"worker": WORKER, "devices": ["cuda:1"]}, record_outputs="upload")
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=60)
    assert run["status"] == "succeeded", run["error"]
    facts = facts_of(run)
    assert facts["cold_start"] is False and facts["instance"] == "cuda:1"
    assert facts["queue_to_first_node_s"] is not None and facts["queue_to_first_node_s"] < 5
    check_image(sc, rid)


def test_a_workflow_queued_to_any_runs_on_a_card_that_can_take_it(comfy_fleet):
    _, sc, _ = comfy_fleet
    rid = sc.submit(image_graph(13, size=80), target="any", record_outputs="upload")
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=150)
    assert run["status"] == "succeeded", run["error"]
    assert run["execution_facts"]["worker"] in (WORKER, BARE, "local")
    check_image(sc, rid)
    # a workflow only one worker's ComfyUI can run (its model file is there alone) goes to that worker
    wait_reading(sc, BARE)
    rid = sc.submit(upscale_graph(), target="any")
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=150)
    assert run["status"] == "succeeded", run["error"]
    assert run["execution_facts"]["worker"] == WORKER


def test_a_workflow_that_loads_a_model_file_reports_its_progress(comfy_fleet):
    _, sc, _ = comfy_fleet
    reading = sc.ok("GET", f"/api/workers/{WORKER}").get("comfyui")
    if isinstance(reading, dict) and "models" in reading:  # where the Workers data lists the files
        assert UPSCALER in reading["models"]["upscale_models"]
    rid = sc.submit(upscale_graph(), target={"worker": WORKER, "devices": ["cuda:1"]}, record_outputs="upload")
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=120)
    assert run["status"] == "succeeded", run["error"]
    progress = [e["payload"] for e in sc.events(rid) if e["type"] == "progress"]
    assert progress and progress[-1]["value"] == progress[-1]["max"] == 4, progress
    assert progress[-1]["node"] == "3" and progress[-1]["class_type"] == "ImageUpscaleWithModel"
    assert progress[-1]["text"] == "ImageUpscaleWithModel (node 3): step 4 of 4"
    (image,) = sc.ok("GET", f"/api/runs/{rid}/outputs/4")["outputs"]
    code, raw = sc.call("GET", f"/api/runs/{rid}/outputs/4/{image['file']}", raw=True)
    assert code == 200 and int.from_bytes(raw[16:20], "big") == 1200  # the PNG's width: upscaled 2x


@pytest.mark.skipif(importlib.util.find_spec("xpufleet.server.comfyflow.check") is None,
                    reason="the door's ComfyUI checks (server/comfyflow/check.py) are not in this tree: without them "
                           "the door validates a run for this server against the fleet's own nodes")
def test_this_server_started_with_comfyui_runs_a_workflow_itself(comfy_fleet):
    fleet, sc, _ = comfy_fleet
    rid = sc.submit(image_graph(14), target="local", record_outputs="upload")
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=150)
    assert run["status"] == "succeeded", run["error"]
    assert run["execution_facts"]["placement"] == "local" and facts_of(run)["instance"] == "cpu"
    spec = json.loads((fleet.home / "runs" / rid / "spec.json").read_text())
    assert spec["kind"] == "comfyui" and "/comfyui/local/cpu/" in spec["comfyui"]["output_dir"]
    check_image(sc, rid)


def test_a_node_that_raises_fails_the_run_naming_the_node_and_the_card(comfy_fleet):
    _, sc, _ = comfy_fleet
    rid = sc.submit(raising_graph(), target={"worker": WORKER, "devices": ["cuda:1"]}, record_outputs="upload")
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=60)
    assert run["status"] == "failed"
    assert run["error"].startswith("node 1 (RegexReplace) failed on box cuda:1: "), run["error"]
    assert "unterminated subpattern" in run["error"]
    (err,) = [e["payload"] for e in sc.events(rid) if e["type"] == "node_error"]
    assert err["node"] == "1" and err["class_type"] == "RegexReplace" and "execution.py" in err["traceback"]


def test_cancel_interrupts_a_long_run_on_its_card(comfy_fleet):
    _, sc, _ = comfy_fleet
    rid = sc.submit(slow_graph(21), target={"worker": WORKER, "devices": ["cuda:1"]}, record_outputs="upload")
    fh_wait_event(sc, rid, "node_started", count=3)
    began = time.monotonic()
    sc.ok("POST", f"/api/runs/{rid}/cancel", {})
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=60)
    assert run["status"] == "cancelled", (run["status"], run["error"])
    assert time.monotonic() - began < 20
    assert not any(e["type"] == "comfy_output" for e in sc.events(rid))  # it never reached SaveImage


def test_kill_9_of_the_instance_fails_the_run_and_the_next_run_starts_a_fresh_one(comfy_fleet):
    fleet, sc, _ = comfy_fleet
    rid = sc.submit(slow_graph(31), target={"worker": WORKER, "devices": ["cuda:1"]}, record_outputs="upload")
    fh_wait_event(sc, rid, "node_started", count=2)
    pid = run_spec(fleet, rid)["comfyui"]["pid"]
    assert pid in comfy_pids(fleet.home)
    os.kill(pid, signal.SIGKILL)
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=60)
    assert run["status"] == "failed"
    assert run["error"].startswith("the ComfyUI on box cuda:1 died while running node "), run["error"]
    assert "comfyui.log" in run["error"]
    again = sc.submit(image_graph(32), target={"worker": WORKER, "devices": ["cuda:1"]}, record_outputs="upload")
    run = sc.wait_run(again, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=150)
    assert run["status"] == "succeeded", run["error"]
    assert facts_of(run)["cold_start"] is True
    assert run_spec(fleet, again)["comfyui"]["pid"] != pid
    check_image(sc, again)


def fh_wait_event(sc: fh.SidecarProc, run_id: str, kind: str, count: int = 1, timeout: float = 120.0) -> None:
    """Until the run has ``count`` events of ``kind`` (long-polled through the events API)."""
    deadline = time.monotonic() + timeout
    cursor = 0
    seen = 0
    while time.monotonic() < deadline:
        body = sc.ok("GET", f"/api/runs/{run_id}/events?cursor={cursor}&wait=2")
        cursor = body["cursor"]
        seen += sum(1 for e in body["events"] if e["type"] == kind)
        if seen >= count:
            return
        assert body["status"] not in ("succeeded", "failed", "cancelled", "interrupted"), body["status"]
    raise AssertionError(f"run {run_id} had {seen} {kind} events, not {count}, after {timeout} s")


def noise_graph() -> dict[str, Any]:
    """EmptyImage -> ImageAddNoise (a seed widget) -> SaveImage: each seed its own image."""
    return {
        "1": {"class_type": "EmptyImage", "inputs": {"width": 48, "height": 48, "batch_size": 1, "color": 8421504}},
        "2": {"class_type": "ImageAddNoise", "inputs": {"image": ["1", 0], "seed": 0, "strength": 0.5}},
        "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "fan"}},
    }


def wait_reading(sc: fh.SidecarProc, worker: str, timeout: float = 120.0) -> dict[str, Any]:
    """Until the worker's ComfyUI has been read (GET /api/workers: comfyui.state ready)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        comfy = sc.worker(worker).get("comfyui") or {}
        if comfy.get("state") == "ready":
            return comfy
        assert comfy.get("state") in ("probing", None), comfy
        time.sleep(0.5)
    raise AssertionError(f"worker {worker}'s ComfyUI was not read within {timeout} s")


def test_a_workflow_whose_model_file_a_worker_lacks_is_refused_there_naming_the_file_and_the_worker(comfy_fleet):
    _, sc, _ = comfy_fleet
    wait_reading(sc, BARE)
    before = {r["id"] for r in sc.ok("GET", "/api/runs?limit=1000")["runs"]}
    code, body = sc.call("POST", "/api/runs", {"graph": upscale_graph(), "options": {"target": {"worker": BARE}}})
    assert code == 400, body
    assert UPSCALER in body["error"] and f"worker {BARE}" in body["error"] and "upscale_models" in body["error"]
    assert {r["id"] for r in sc.ok("GET", "/api/runs?limit=1000")["runs"]} == before  # nothing stored


def test_a_node_class_the_workers_comfyui_lacks_is_refused_with_its_name(comfy_fleet):
    _, sc, _ = comfy_fleet
    wait_reading(sc, WORKER)
    graph = image_graph(41)
    graph["9"] = {"class_type": "QueuingSideOnlyNode", "inputs": {"image": ["2", 0]}}  # a custom node only here
    code, body = sc.call("POST", "/api/runs", {"graph": graph, "options": {"target": {"worker": WORKER}}})
    assert code == 400, body
    assert "QueuingSideOnlyNode" in body["error"] and f"worker {WORKER}" in body["error"], body


def test_fan_out_of_8_seeds_over_2_cards_gives_8_images_in_seed_order_on_both_cards(comfy_fleet):
    _, sc, _ = comfy_fleet
    seeds = list(range(500, 508))
    sweep = sc.ok("POST", "/api/sweeps", {"name": "fan-out", "graph": noise_graph(), "parameters": {"2.seed": seeds},
                                          "options": {"target": {"worker": WORKER}}}, status=201)
    deadline = time.monotonic() + 240
    while True:
        body = sc.ok("GET", f"/api/sweeps/{sweep['sweep_id']}")
        if body["status"] not in ("queued", "running") or time.monotonic() > deadline:
            break
        time.sleep(1.0)
    rows = body["table"]
    assert len(rows) == 8 and all(r["status"] == "succeeded" for r in rows), rows
    by_seed = sorted(rows, key=lambda r: r["parameters"]["2.seed"])
    assert [r["parameters"]["2.seed"] for r in by_seed] == seeds
    cards, digests = set(), []
    for row in by_seed:
        run = sc.run(row["run_id"])
        cards.add(facts_of(run)["instance"])
        node = sc.ok("GET", f"/api/runs/{row['run_id']}/outputs/3")
        (image,) = node["outputs"]
        code, raw = sc.call("GET", f"/api/runs/{row['run_id']}/outputs/3/{image['file']}", raw=True)
        assert code == 200 and raw[:8] == b"\x89PNG\r\n\x1a\n"
        digests.append(raw)
    assert cards == {"cuda:0", "cuda:1"}, cards
    assert len(set(digests)) == 8  # every seed its own noise


def test_a_workflow_queued_to_a_one_shot_pool_runs_on_an_instance_that_then_exits(comfy_fleet):
    fleet, sc, _ = comfy_fleet
    comfy_dir, python = comfy_harness.configured()
    created = fleet.cli("pools", "create", "spot", "--comfyui", str(comfy_dir))
    assert created.returncode == 0, created.stderr
    assert f"--comfyui {comfy_dir}" in created.stdout, created.stdout  # the join command says it
    token = created.stdout.split("--join ")[1].split()[0]
    rid = sc.submit(image_graph(51), target={"pool": "spot"})  # waits for an instance (and its reading)
    spot = fleet.agent("--one-shot", "--join", token, "--simulate", "cuda:0=24", "--comfyui", str(comfy_dir),
                       "--comfyui-python", str(python), label="spot")
    spot.wait_connected()
    run = sc.wait_run(rid, {"succeeded", "failed", "cancelled", "interrupted"}, timeout=180)
    assert run["status"] == "succeeded", run["error"]
    assert run["target"] == "pool:spot" and facts_of(run)["instance"] == "cuda:0"
    check_image(sc, rid)  # uploaded before the instance left
    assert spot.wait_exit(120) == 0
