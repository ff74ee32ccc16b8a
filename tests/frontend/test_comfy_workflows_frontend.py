"""A ComfyUI run's results in the real ComfyUI 0.3.64 page (issue 30 §2, §3; docs/runs-panel.md "Gallery"):
the Runs panel's gallery (thumbnail, full size on click, download) with the files copied into ComfyUI's
output folder (server/comfy/home.py), the images on the canvas that queued the run, Queue on...'s fan-out
of seeds, and the sweep view's images (an XY grid for two parameters).

The run stands for a finished ComfyUI run: a run of the sidecar's own whose recorded outputs are replaced by
the layout a ComfyUI run uploads (docs/comfyui.md "Recorded outputs of a ComfyUI run") with a real PNG. The
sweeps are the server's answers, stood in for by Playwright's routes (the real fan-out runs in the e2e tests
with a worker's ComfyUI). A real sidecar, Debian's Chromium."""

from __future__ import annotations

import contextlib
import json
import struct
import time
import zlib
from pathlib import Path

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

from xpufleet.common.client import ApiError

pytestmark = [pytest.mark.browser, pytest.mark.comfy, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"Comfy.TutorialCompleted": True, "XPUFleet.Language": "en"}
SAVE_NODE = "9"
IMAGE = "ComfyUI_00001_.png"
HOME_NAME = f"{SAVE_NODE}_{IMAGE}"  # server/comfy/home.py local_name
# a core-node workflow that needs no weights: EmptyImage -> SaveImage
WORKFLOW = {
    "5": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 16711680}},
    SAVE_NODE: {"class_type": "SaveImage", "inputs": {"images": ["5", 0], "filename_prefix": "ComfyUI"}},
}
# one with a seed widget (KSampler's): what Queue on... fans out; never run here
SEEDED = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "small.safetensors"}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a red fox", "clip": ["4", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["4", 1]}},
    "8": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
    "3": {"class_type": "KSampler", "inputs": {"seed": 42, "steps": 20, "cfg": 8.0, "sampler_name": "euler",
                                               "scheduler": "normal", "denoise": 1.0, "model": ["4", 0],
                                               "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["8", 0]}},
    "10": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
    SAVE_NODE: {"class_type": "SaveImage", "inputs": {"images": ["10", 0], "filename_prefix": "ComfyUI"}},
}


def png(width: int, height: int, rgb: tuple[int, int, int]) -> bytes:
    """A real PNG of one colour (no imaging library needed)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    rows = b"".join(b"\x00" + bytes(rgb) * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))


PNG = png(64, 48, (220, 40, 40))


def record_comfy_outputs(home: Path, run_id: str) -> None:
    """The recorded outputs a ComfyUI run's SaveImage leaves (the design's §5 layout), in the run's folder."""
    folder = home / "runs" / run_id / "recorded_outputs"
    node = folder / SAVE_NODE
    node.mkdir(parents=True, exist_ok=True)
    (node / IMAGE).write_bytes(PNG)
    output = {"kind": "image", "name": "images", "index": 0, "file": IMAGE, "bytes": len(PNG), "media_type": "image/png"}
    ui = {"images": [{"filename": IMAGE, "subfolder": "", "type": "output"}]}
    bh.write_json(node / "outputs.json", {"node": SAVE_NODE, "class_type": "SaveImage", "outputs": [output], "ui": ui})
    bh.write_json(folder / "index.json", {"run_id": run_id, "mode": "upload", "kind": "comfyui", "complete": True,
                                          "nodes": [{"node": SAVE_NODE, "class_type": "SaveImage", "outputs": [output],
                                                     "files": [IMAGE], "bytes": len(PNG)}]})


@pytest.fixture(scope="module")
def comfy_run(comfy_fleet, comfy_host) -> str:
    """A succeeded run on this server holding a ComfyUI run's recorded outputs."""
    sc = comfy_fleet.sidecar
    run_id = sc.submit(bh.sidecar_harness.iris_graph(1), name="comfy image run", target={"worker": "local"},
                       record_outputs=True)
    run = sc.finish(run_id, timeout=bh.WAIT_S * 2)
    assert run["status"] == "succeeded", run["error"]
    record_comfy_outputs(comfy_host.home, run_id)
    return run_id


@pytest.fixture(scope="module")
def session(playwright_browser, comfy_host, comfy_fleet):
    with bh.comfy_page(playwright_browser, comfy_host, SETTINGS, height=1000, accept_downloads=True) as (page, log):
        yield page, log


def open_tab(page, name: str, panel: str):
    root = page.locator(f"[data-xpufleet={panel}]")
    bottom = page.locator(".bottom-panel")
    if not bottom.is_visible():
        page.locator("button.side-bar-button[aria-label^='Toggle Bottom Panel']").click(timeout=WAIT_MS)
    bottom.get_by_role("tab", name=name).click(timeout=WAIT_MS)
    root.wait_for(timeout=WAIT_MS)
    return root


def image_loaded(page, selector: str) -> dict:
    """Wait until the image at ``selector`` has loaded; its natural size."""
    page.wait_for_function("(s) => { const i = document.querySelector(s); return i && i.complete && i.naturalWidth > 0; }",
                           arg=selector, timeout=WAIT_MS)
    return page.evaluate("(s) => { const i = document.querySelector(s); return {w: i.naturalWidth, h: i.naturalHeight, src: i.getAttribute('src')}; }", selector)


def test_the_runs_gallery_brings_the_files_home_and_shows_them_full_size(session, comfy_host, comfy_run, screenshots, tmp_path):
    page, log = session
    runs = open_tab(page, "runs", "runs-panel")
    runs.locator(f"[data-run-id='{comfy_run}'] .xf-run-pick").click(timeout=WAIT_MS)
    runs.locator("[data-xpufleet=detail-status]", has_text="succeeded").wait_for(timeout=WAIT_MS)
    thumb = runs.locator(f"[data-xpufleet=gallery] figure[data-node='{SAVE_NODE}'] img")
    thumb.wait_for(timeout=WAIT_MS)
    shown = image_loaded(page, "[data-xpufleet=gallery] img[data-xpufleet=gallery-thumb]")
    assert (shown["w"], shown["h"]) == (64, 48)
    assert shown["src"] == f"/view?filename={HOME_NAME}&subfolder=xpufleet%2F{comfy_run}&type=output"
    # the file arrived in ComfyUI's output folder, byte for byte
    copied = comfy_host.base / "output" / "xpufleet" / comfy_run / HOME_NAME
    assert copied.read_bytes() == PNG
    assert runs.locator("[data-xpufleet=gallery-folder]").inner_text() == f"Copied into ComfyUI's output/xpufleet/{comfy_run}"
    page.screenshot(path=str(screenshots / "comfy-runs-gallery.png"))
    # full size on click
    runs.locator("[data-xpufleet=gallery-open]").first.click()
    box = page.locator("[data-xpufleet=lightbox]")
    box.wait_for(timeout=WAIT_MS)
    full = image_loaded(page, "[data-xpufleet=lightbox-img]")
    assert (full["w"], full["h"]) == (64, 48)
    rendered = box.locator("[data-xpufleet=lightbox-img]").bounding_box()
    assert rendered["width"] >= 64  # never shown smaller than the image
    page.screenshot(path=str(screenshots / "comfy-gallery-full-size.png"))
    with page.expect_download(timeout=WAIT_MS) as info:
        box.locator("[data-xpufleet=gallery-download]").click()
    saved = tmp_path / "download.png"
    info.value.save_as(saved)
    assert saved.read_bytes() == PNG and info.value.suggested_filename == HOME_NAME
    page.keyboard.press("Escape")
    box.wait_for(state="detached", timeout=WAIT_MS)
    assert [f for f in log.failed if "xpufleet" in f or "/view" in f] == [], log.failed


def test_a_training_runs_saved_model_comes_home_to_comfyuis_model_folder(session, comfy_fleet, comfy_host):
    """Queued with record_outputs "upload": the ModelSaver's model lands in models/xpufleet/<its filename> in
    ModelSaver's own format (architecture included), so a ModelLoader on the canvas finds it."""
    from xpufleet.nodes.lib.modelfile import read_model_file

    page, _ = session
    graph = bh.sidecar_harness.iris_graph(1)
    loop = next(n for n, v in graph.items() if v["class_type"] == "XPUTrainingLoop")
    graph["90"] = {"class_type": "XPUModelSaver", "inputs": {"model": [loop, 0], "filename": "models/iris_home.safetensors",
                                                             "format": "safetensors", "location": "run_dir", "overwrite": True}}
    sc = comfy_fleet.sidecar
    run_id = sc.submit(graph, name="iris saved home", target={"worker": "local"}, record_outputs="upload")
    run = sc.finish(run_id, timeout=bh.WAIT_S * 2)
    assert run["status"] == "succeeded", run["error"]
    runs = open_tab(page, "runs", "runs-panel")
    runs.locator(f"[data-run-id='{run_id}'] .xf-run-pick").click(timeout=WAIT_MS)
    line = runs.locator("[data-xpufleet=model-home][data-file='models/iris_home.safetensors']")
    line.wait_for(timeout=WAIT_MS)
    assert "models/xpufleet/models/iris_home.safetensors" in line.inner_text()
    assert runs.locator("[data-xpufleet=gallery]").count() == 0  # no image: no gallery
    spec, state = read_model_file(comfy_host.base / "models" / "xpufleet" / "models" / "iris_home.safetensors")
    # the same model as the one ModelSaver wrote in the run's folder
    (saved,) = (comfy_host.home / "runs" / run_id).rglob("iris_home.safetensors")
    saved_spec, saved_state = read_model_file(saved)
    assert spec == saved_spec and spec.get("builder") == "mlp"
    assert sorted(state) == sorted(saved_state) and all(state[k].equal(saved_state[k]) for k in state)


def test_a_run_queued_from_this_canvas_shows_its_image_on_the_save_node(session, comfy_run, screenshots):
    """The page follows the runs it queued (sessionStorage, so also across a reload) and puts their images on
    the canvas's output nodes through the front end's own `executed` path."""
    page, _ = session
    bh.load_api_graph(page, WORKFLOW, "image-home")
    page.wait_for_function("() => app.graph.getNodeById(9) && app.extensionManager.workflow.activeWorkflow", timeout=WAIT_MS)
    page.reload(timeout=WAIT_MS)  # the workflow as ComfyUI restores it: the key Queue on... would see
    page.wait_for_function(bh.APP_READY, timeout=WAIT_MS)
    page.wait_for_function("() => app.graph.getNodeById(9) && app.extensionManager.workflow.activeWorkflow", timeout=WAIT_MS)
    key = page.evaluate("() => { const w = app.extensionManager.workflow.activeWorkflow; return w.path || w.filename; }")
    assert page.evaluate("() => app.nodeOutputs['9'] ?? null") is None
    page.evaluate("([run, key]) => sessionStorage.setItem('XPUFleet.CanvasRuns', JSON.stringify([{run, key}]))", [comfy_run, key])
    page.reload(timeout=WAIT_MS)
    page.wait_for_function(bh.APP_READY, timeout=WAIT_MS)
    page.wait_for_function("(n) => app.nodeOutputs[n]?.images?.[0]?.filename", arg=SAVE_NODE, timeout=WAIT_MS)
    output = page.evaluate("(n) => app.nodeOutputs[n]", SAVE_NODE)
    assert output["images"] == [{"filename": HOME_NAME, "subfolder": f"xpufleet/{comfy_run}", "type": "output"}]
    # the node draws it (ComfyUI loads node.imgs from the output)
    page.wait_for_function("(n) => { const i = app.graph.getNodeById(Number(n))?.imgs?.[0]; return i && i.complete && i.naturalWidth === 64; }",
                           arg=SAVE_NODE, timeout=WAIT_MS)
    # followed once: the page forgets the run
    page.wait_for_function("() => (sessionStorage.getItem('XPUFleet.CanvasRuns') || '[]') === '[]'", timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "comfy-canvas-home.png"))


def fake_sweep(sweep_id: str, run_id: str, params: dict[str, list]) -> dict:
    """A finished sweep of a ComfyUI workflow as GET /api/sweeps/{id} answers, each variant the same run."""
    paths = list(params)
    points: list[dict] = [{}]
    for p in paths:
        points = [{**pt, p: v} for pt in points for v in params[p]]
    table = [{"rank": None, "variant": i, "point": i, "parameters": pt, "seed": None, "status": "succeeded",
              "metric": None, "run_id": run_id, "worker_id": "gpu-box", "devices": ["cuda:0"], "progress": None}
             for i, pt in enumerate(points)]
    return {"id": sweep_id, "name": sweep_id, "status": "finished", "kind": "comfyui", "objective": None,
            "parameters": paths, "labels": {}, "n_runs": len(table), "counts": {"succeeded": len(table)},
            "version": 1, "table": table, "created_at": 1.0}


def test_fan_out_from_queue_on_and_the_sweeps_images(session, comfy_run, screenshots):
    page, _ = session
    posted: list[dict] = []
    sweeps = {"fan-out": fake_sweep("fan-out", comfy_run, {"3.seed": [42, 43, 44, 45]}),
              "xy-grid": fake_sweep("xy-grid", comfy_run, {"3.steps": [10, 20], "3.cfg": [4.0, 8.0]})}

    def answer(route):
        req = route.request
        tail = req.url.split("/xpufleet/api/sweeps", 1)[1].split("?", 1)[0].strip("/")
        if req.method == "POST":
            posted.append(json.loads(req.post_data))
            return route.fulfill(status=201, content_type="application/json", body=json.dumps({"sweep_id": "fan-out"}))
        if not tail:
            return route.fulfill(content_type="application/json", body=json.dumps({"sweeps": list(sweeps.values())}))
        return route.fulfill(content_type="application/json", body=json.dumps(sweeps[tail]))

    page.route("**/xpufleet/api/sweeps**", answer)
    try:
        bh.load_api_graph(page, SEEDED, "fan-out")
        page.locator("[data-xpufleet=queue-on]").first.click(timeout=WAIT_MS)
        dialog = page.locator("[data-xpufleet=queue-dialog]")
        box = dialog.locator("[data-xpufleet=fan-box]")
        box.wait_for(timeout=WAIT_MS)
        fan = box.locator("[data-xpufleet=fan-out]")
        assert not fan.is_checked()  # one run stays the default
        fan.check()
        box.locator("[data-xpufleet=fan-count]").fill("4")
        box.locator("[data-xpufleet=fan-note]", has_text="4 runs, seeds 42 to 45").wait_for(timeout=WAIT_MS)
        dialog.locator("[data-target='any']").check()
        page.screenshot(path=str(screenshots / "comfy-queue-fan-out.png"))
        dialog.locator("[data-xpufleet=queue-submit]").click()
        dialog.wait_for(state="detached", timeout=WAIT_MS)
        (body,) = posted
        assert body["parameters"] == {"3.seed": [42, 43, 44, 45]} and body["mode"] == "grid"
        assert body["options"]["target"]["worker"] == "any" and body["graph"]["3"]["class_type"] == "KSampler"
        assert "objective" not in body and body["name"] == "fan-out"
        # the sweep's view: its variants' images in order
        panel = page.locator("[data-xpufleet=sweeps-panel]")
        images = panel.locator("[data-xpufleet=sweep-images]")
        images.locator("[data-xpufleet=sweep-thumb] img").nth(3).wait_for(timeout=WAIT_MS)
        variants = images.locator("figure[data-variant]")
        assert [variants.nth(i).get_attribute("data-variant") for i in range(4)] == ["0", "1", "2", "3"]
        assert "3.seed=42" in variants.nth(0).inner_text() and "3.seed=45" in variants.nth(3).inner_text()
        image_loaded(page, "[data-xpufleet=sweep-images] [data-xpufleet=sweep-thumb] img")
        page.screenshot(path=str(screenshots / "comfy-fan-out-sweep.png"))
        # two parameters: an XY grid with the values on its axes
        panel.locator("[data-sweep-id='xy-grid'] .xf-run-pick").click(timeout=WAIT_MS)
        grid = panel.locator("[data-xpufleet=sweep-xy]")
        grid.locator("[data-xpufleet=sweep-thumb] img").nth(3).wait_for(timeout=WAIT_MS)
        assert grid.locator("th[data-axis=x]").all_inner_texts() == ["10", "20"]
        assert grid.locator("th[data-axis=y]").all_inner_texts() == ["4", "8"]
        page.screenshot(path=str(screenshots / "comfy-sweep-xy-grid.png"))
        panel.locator("[data-xpufleet=sweep-thumb]").first.click()
        page.locator("[data-xpufleet=lightbox]").wait_for(timeout=WAIT_MS)
        image_loaded(page, "[data-xpufleet=lightbox-img]")
        page.keyboard.press("Escape")
    finally:
        page.unroute("**/xpufleet/api/sweeps**")


def test_the_standalone_pages_gallery_reads_the_recorded_outputs(playwright_browser, standalone_fleet, screenshots):
    """The sidecar's own page (no ComfyUI to copy into): the images read from the run's recorded outputs with
    the page's session, full size on click."""
    sc = standalone_fleet.sidecar
    run_id = sc.submit(bh.sidecar_harness.iris_graph(1), name="comfy image run", target={"worker": "local"},
                       record_outputs=True)
    assert sc.finish(run_id, timeout=bh.WAIT_S * 2)["status"] == "succeeded"
    record_comfy_outputs(standalone_fleet.home, run_id)
    with bh.standalone_page(playwright_browser, standalone_fleet, SETTINGS) as (page, log):
        page.click("[data-xpufleet=tab-runs]")
        runs = page.locator("[data-xpufleet=runs-panel]")
        runs.locator(f"[data-run-id='{run_id}'] .xf-run-pick").click(timeout=WAIT_MS)
        shown = image_loaded(page, "[data-xpufleet=gallery] img[data-xpufleet=gallery-thumb]")
        assert (shown["w"], shown["h"]) == (64, 48) and shown["src"].startswith("blob:")
        assert runs.locator("[data-xpufleet=gallery-folder]").count() == 0  # nothing copied anywhere
        runs.locator("[data-xpufleet=gallery-open]").click()
        image_loaded(page, "[data-xpufleet=lightbox-img]")
        page.screenshot(path=str(screenshots / "standalone-gallery-full-size.png"))
        page.locator("[data-xpufleet=lightbox-close]").click()
        page.locator("[data-xpufleet=lightbox]").wait_for(state="detached", timeout=WAIT_MS)
        assert log.errors == [] and log.failed == [], (log.errors, log.failed)


# --- with a worker's real ComfyUI (the runtime: `xpufleet agent start --comfyui PATH`) ----------------

NOISY = {  # a seed widget and no weights: EmptyImage -> ImageAddNoise(seed) -> SaveImage
    "5": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 48, "batch_size": 1, "color": 8421504}},
    "6": {"class_type": "ImageAddNoise", "inputs": {"image": ["5", 0], "seed": 7, "strength": 0.5}},
    SAVE_NODE: {"class_type": "SaveImage", "inputs": {"images": ["6", 0], "filename_prefix": "noisy"}},
}
COMFY_WORKER = "comfy-box"


def comfyui_pids(home: Path) -> list[int]:
    """The ComfyUI instances started for ``home`` (their folders are under $XPUFLEET_HOME/comfyui/)."""
    mark = str(home / "comfyui")
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if "main.py" in cmd and mark in cmd:
                found.append(int(proc.name))
    return found


@pytest.fixture(scope="module")
def comfy_worker(comfy_fleet, comfy_host):
    """The agent comfy-box with two simulated cards and the real ComfyUI (skipped where the agent has no
    --comfyui); its first run (a cold instance) has succeeded. No ComfyUI is left running after."""
    import os
    import signal
    import subprocess
    import sys

    helped = subprocess.run([sys.executable, "-m", "xpufleet.server", "agent", "start", "--help"],
                            capture_output=True, text=True, timeout=60)
    if "--comfyui" not in helped.stdout:
        pytest.skip("the agent has no --comfyui here (the ComfyUI runtime of issue 30)")
    comfy_dir, python = bh.comfy_harness.configured()
    agent = bh.sidecar_harness.AgentProcess(comfy_fleet.sidecar, COMFY_WORKER, None, "--simulate", "cuda:0=24,cuda:1=24",
                                            "--comfyui", str(comfy_dir), "--comfyui-python", str(python))
    comfy_fleet.agents.append(agent)
    try:
        comfy_fleet.wait_worker(COMFY_WORKER, "Online")
        deadline = time.monotonic() + bh.WAIT_S * 2
        while True:  # its ComfyUI is read after it joins: a named worker may refuse until then
            try:
                first = comfy_fleet.sidecar.submit(WORKFLOW, name="warm-up", target={"worker": COMFY_WORKER, "devices": ["cuda:0"]})
                break
            except ApiError as exc:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{COMFY_WORKER} never took a ComfyUI run: {exc}") from None
                time.sleep(1)
        run = comfy_fleet.sidecar.finish(first, timeout=bh.WAIT_S * 2)
        assert run["status"] == "succeeded", run["error"]
        yield agent
    finally:
        agent.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            agent.proc.wait(timeout=60)
        if agent.proc.poll() is None:
            agent.proc.kill()
        for pid in comfyui_pids(comfy_host.home):  # never leave a ComfyUI behind
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_queue_on_a_worker_card_brings_the_image_home_to_the_runs_panel_and_the_canvas(session, comfy_worker, comfy_host,
                                                                                      screenshots):
    page, _ = session
    bh.load_api_graph(page, WORKFLOW, "fleet-image")
    page.wait_for_function("() => app.graph.getNodeById(9)", timeout=WAIT_MS)
    page.locator("[data-xpufleet=queue-on]").first.click(timeout=WAIT_MS)
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    dialog.locator(f"[data-target='worker:{COMFY_WORKER}']").check(timeout=WAIT_MS)
    dialog.locator("[data-device='cuda:1']").check()
    dialog.locator("[data-xpufleet=queue-submit]").click()
    dialog.wait_for(state="detached", timeout=WAIT_MS)
    runs = page.locator("[data-xpufleet=runs-panel]")
    runs.locator("[data-xpufleet=detail-status]", has_text="succeeded").wait_for(timeout=WAIT_MS * 2)
    run_id = runs.locator(".xf-run-row.xf-selected").get_attribute("data-run-id")
    shown = image_loaded(page, "[data-xpufleet=gallery] img[data-xpufleet=gallery-thumb]")
    assert (shown["w"], shown["h"]) == (64, 48)
    copied = list((comfy_host.base / "output" / "xpufleet" / run_id).glob("*.png"))
    assert len(copied) == 1 and copied[0].read_bytes().startswith(b"\x89PNG")
    # on the canvas that queued it
    page.wait_for_function("(n) => { const i = app.graph.getNodeById(Number(n))?.imgs?.[0]; return i && i.complete && i.naturalWidth === 64; }",
                           arg=SAVE_NODE, timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "comfy-worker-run-home.png"))


def test_fan_out_of_four_seeds_over_the_worker_cards(session, comfy_worker, comfy_fleet, comfy_host, screenshots):
    page, _ = session
    bh.load_api_graph(page, NOISY, "fleet-noise")
    page.locator("[data-xpufleet=queue-on]").first.click(timeout=WAIT_MS)
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    box = dialog.locator("[data-xpufleet=fan-box]")
    box.locator("[data-xpufleet=fan-out]").check(timeout=WAIT_MS)
    box.locator("[data-xpufleet=fan-count]").fill("4")
    box.locator("[data-xpufleet=fan-note]", has_text="seeds 7 to 10").wait_for(timeout=WAIT_MS)
    dialog.locator(f"[data-target='worker:{COMFY_WORKER}']").check()
    dialog.locator("[data-xpufleet=queue-submit]").click()
    dialog.wait_for(state="detached", timeout=WAIT_MS)
    panel = page.locator("[data-xpufleet=sweeps-panel]")
    panel.locator("[data-xpufleet=sweep-status][data-status=finished]").wait_for(timeout=WAIT_MS * 3)
    thumbs = panel.locator("[data-xpufleet=sweep-images] [data-xpufleet=sweep-thumb] img")
    thumbs.nth(3).wait_for(timeout=WAIT_MS)
    sweep_id = panel.locator(".xf-run-row.xf-selected").get_attribute("data-sweep-id")
    table = sorted(comfy_fleet.call("GET", f"/api/sweeps/{sweep_id}")["table"], key=lambda r: r["variant"])
    assert [r["parameters"]["6.seed"] for r in table] == [7, 8, 9, 10]
    assert all(r["status"] == "succeeded" for r in table)
    figures = panel.locator("[data-xpufleet=sweep-images] figure[data-variant]")
    assert [figures.nth(i).get_attribute("data-variant") for i in range(4)] == [str(r["variant"]) for r in table]
    images = [next((comfy_host.base / "output" / "xpufleet" / r["run_id"]).glob("*.png")).read_bytes() for r in table]
    assert len(set(images)) == 4  # four seeds, four different images
    page.screenshot(path=str(screenshots / "comfy-worker-fan-out.png"))
