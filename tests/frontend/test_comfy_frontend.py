"""The front end in the real ComfyUI (docs/comfyui.md): Debian's Chromium, the plugin loaded from
custom_nodes/, a real sidecar and an agent simulating two 24 GiB CUDA cards (gpu-box). Every check
is on what a user sees on the page; the server answers are asked directly only to confirm them.

Screenshots of each panel go to the folder the run prints (conftest.py)."""

from __future__ import annotations

import json

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

from xpufleet.server.devices import set_simulated_free

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

REFRESH_S = 2  # the capsule's refresh interval in these tests (setting XPUFleet.Capsule.RefreshSeconds)
MODEL_GRAPH = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "small.safetensors"}}}
SETTINGS = {"Comfy.TutorialCompleted": True, "XPUFleet.Predict.Device": "gpu-box/cuda:0",
            "XPUFleet.Capsule.RefreshSeconds": REFRESH_S, "XPUFleet.Language": "en"}
WAIT_MS = int(bh.WAIT_S * 1000)


@pytest.fixture(scope="module")
def session(playwright_browser, comfy_host, comfy_fleet):
    """One ComfyUI page for the module, its console recorded from the first request."""
    with bh.comfy_page(playwright_browser, comfy_host, SETTINGS) as (page, log):
        yield page, log


def wait_capsule(page, condition: str) -> dict:
    page.wait_for_function(f"() => {{ const c = document.querySelector('[data-xpufleet=capsule]').dataset; return {condition}; }}",
                           timeout=WAIT_MS)
    return bh.capsule(page)


def close_bottom_panel(page) -> None:
    page.evaluate("() => document.querySelector('[data-xpufleet=runs-panel], [data-xpufleet=workers-panel]') "
                  "&& app.extensionManager.command.execute('Workspace.ToggleBottomPanel')")


def test_the_capsule_shows_a_level_and_follows_the_model_widget(session, screenshots):
    page, _ = session
    bh.load_api_graph(page, MODEL_GRAPH, "models")
    small = wait_capsule(page, "c.mPeak === '2'")
    # 2 GiB on gpu-box's 24 GiB card: the server's answer, Smooth, its colour and label
    assert small["level"] == "smooth" and small["p"] == "100" and "Smooth" in small["text"]
    assert "24.0 GiB free of 24.0 GiB" in small["vram"] and "(sim.)" in small["vram"]
    page.hover("[data-xpufleet=capsule]")
    tip = page.locator("[data-xpufleet=capsule-tooltip]")
    tip.wait_for(state="visible")
    text = tip.inner_text()
    for name in ("M_peak", "M_total", "V_free", "V_alloc", "V_rsv", "V_eff", "gamma", "C_ram", "S_virt", "P_peak",
                 "P_load", "small.safetensors", "SIMULATED"):
        assert name in text, name
    page.screenshot(path=str(screenshots / "comfy-capsule-tooltip.png"))
    page.mouse.move(700, 600)
    # a user picks the other checkpoint on the canvas: the capsule rescans and the prediction changes
    bh.choose_combo(page, "CheckpointLoaderSimple", "ckpt_name", "big.safetensors")
    big = wait_capsule(page, "c.mPeak === '60'")
    assert big["level"] == "critical" and int(big["p"]) < int(small["p"])
    workflow = page.evaluate("() => app.graph.serialize()")
    assert workflow["nodes"][0]["widgets_values"][0] == "big.safetensors"
    # the same answer the server gives for that workflow on that card
    answer = json.loads(page.evaluate("""async (w) => JSON.stringify(await (await fetch('/xpufleet/predict',
        {method: 'POST', body: JSON.stringify({workflow: w, worker: 'gpu-box', device: 'cuda:0'}),
         headers: {'Content-Type': 'application/json', 'X-XPUFleet-Request': '1',  // what the guard wants
                   'X-XPUFleet-Pairing': localStorage.getItem('xpufleet.pairing')}})).json())""", workflow))
    assert answer["p_success"] == int(big["p"]) and answer["level"] == "critical"
    page.screenshot(path=str(screenshots / "comfy-capsule-critical.png"), clip={"x": 0, "y": 0, "width": 1500, "height": 60})
    # the capsule's menu: this machine (no GPU here, said so), then the worker's card again
    menu = page.locator("[data-xpufleet=device-menu]")
    page.click("[data-xpufleet=capsule]")
    menu.locator("[data-value='gpu-box/cuda:1']").wait_for(timeout=WAIT_MS)
    assert "(simulated)" in menu.locator("[data-value='gpu-box/cuda:1']").inner_text()
    menu.locator("[data-value=auto]").click()
    page.wait_for_function("() => document.querySelector('[data-xpufleet=vram]').innerText === 'VRAM: no GPU'", timeout=WAIT_MS)
    assert page.locator("[data-xpufleet=capsule] .xf-badge").count() == 1  # the reason is in the tooltip
    assert page.evaluate("() => app.extensionManager.setting.get('XPUFleet.Predict.Device')") == "auto"
    page.click("[data-xpufleet=capsule]")
    page.keyboard.press("Escape")
    menu.wait_for(state="hidden")
    page.click("[data-xpufleet=capsule]")
    menu.locator("[data-value='gpu-box/cuda:0']").click(timeout=WAIT_MS)
    wait_capsule(page, "document.querySelector('[data-xpufleet=vram]').innerText.includes('(sim.)')")
    assert page.evaluate("() => app.extensionManager.setting.get('XPUFleet.Predict.Device')") == "gpu-box/cuda:0"


def test_the_capsule_follows_a_snapshot_change_within_one_refresh(session, comfy_host, comfy_fleet):
    page, _ = session
    bh.load_api_graph(page, MODEL_GRAPH, "models")
    wait_capsule(page, "c.mPeak === '2'")
    set_simulated_free(comfy_host.home, "gpu-box", "cuda:0", 3.5)
    comfy_fleet.wait_card_free("gpu-box", "cuda:0", 3.5)  # the sidecar has it (next heartbeat)
    started = int(bh.capsule(page)["ticks"])
    page.wait_for_function("() => document.querySelector('[data-xpufleet=vram]').dataset.free === '3.5'", timeout=WAIT_MS)
    seen = bh.capsule(page)
    # shown by the first periodic refresh that started after the server had the figure, or earlier
    assert int(seen["answerTick"]) <= started + 1, (started, seen)
    assert "3.5 GiB free of 24.0 GiB" in seen["vram"]
    set_simulated_free(comfy_host.home, "gpu-box", "cuda:0", 24)
    comfy_fleet.wait_card_free("gpu-box", "cuda:0", 24)


def test_queue_on_sends_the_canvas_graph_to_the_worker_cards_and_the_run_finishes_with_its_chart(
        session, comfy_fleet, screenshots):
    page, _ = session
    graph = bh.sidecar_harness.iris_graph(epochs=3)
    bh.load_api_graph(page, graph, "iris-canvas")
    prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
    # keyboard: the button beside Run opens the dialog
    page.focus("[data-xpufleet=queue-on]")
    page.keyboard.press("Enter")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    dialog.locator("[data-target='worker:gpu-box']").wait_for(timeout=WAIT_MS)
    assert dialog.locator("[data-target=local]").is_checked()
    dialog.locator("[data-target='worker:gpu-box']").check()
    dialog.locator("[data-device='cuda:1']").check()
    assert "cuda:1 → cuda:0 in this run" in dialog.locator("[data-alias='cuda:1']").inner_text()
    dialog.locator("[data-xpufleet=budget][data-source]").wait_for(timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "comfy-queue-on.png"))
    dialog.locator("[data-xpufleet=queue-submit]").click()
    runs = page.locator("[data-xpufleet=runs-panel]")
    runs.or_(dialog.locator("[data-xpufleet=queue-error]:not(:empty)")).first.wait_for(timeout=WAIT_MS)
    assert runs.is_visible(), f"the server refused the run: {dialog.locator('[data-xpufleet=queue-error]').inner_text()}"
    status = runs.locator("[data-xpufleet=detail-status]")
    status.filter(has_text="succeeded").wait_for(timeout=WAIT_MS * 2)
    chart = runs.locator("[data-xpufleet=chart][data-drawn=true]")
    chart.wait_for(timeout=WAIT_MS)
    assert {"train_loss", "val_accuracy"} <= set(chart.get_attribute("data-series").split(","))
    assert int(chart.get_attribute("data-points")) >= 6  # 3 epochs of train_loss, val_loss, val_accuracy
    # uPlot drew one panel per kind of figure: losses, accuracies, the throughput (docs/runs-panel.md)
    assert chart.get_attribute("data-groups") == "loss,accuracy,throughput"
    assert runs.locator("[data-xpufleet=chart] .u-over").count() == 3
    run_id = runs.locator(".xf-run-row.xf-selected").get_attribute("data-run-id")
    run = comfy_fleet.call("GET", f"/api/runs/{run_id}")
    assert run["status"] == "succeeded" and run["worker_id"] == "gpu-box" and run["devices"] == ["cuda:1"]
    assert run["graph"] == prompt  # ComfyUI's own graph-to-prompt, as it was on the canvas
    assert run["execution_facts"]["device_aliases"] == {"cuda:0": "cuda:1"}
    assert "gpu-box · devices: cuda:1" in runs.inner_text()
    peak = runs.locator("[data-xpufleet=peak]")
    assert "not measured" in peak.inner_text() and peak.get_attribute("title")  # CPU work: said on hover
    page.screenshot(path=str(screenshots / "comfy-runs-panel.png"))


def test_workers_panel_shows_the_simulated_cards_and_drain_greys_the_worker_out(session, comfy_fleet, screenshots):
    page, _ = session
    page.evaluate("() => app.extensionManager.command.execute('XPUFleet.ShowWorkers')")
    panel = page.locator("[data-xpufleet=workers-panel]")
    card = panel.locator("[data-worker=gpu-box]")
    card.wait_for(timeout=WAIT_MS)
    text = card.inner_text()
    assert "Online" in text and "SIMULATED cards" in text and "same as the server" in text
    for device in ("cpu", "cuda:0", "cuda:1"):
        assert card.locator(f"tr[data-device='{device}']").count() == 1
    assert card.locator("tr[data-device='cuda:0'] .xf-sim").inner_text() == "simulated"
    refreshes = int(panel.get_attribute("data-refreshes"))
    page.wait_for_function(f"() => +document.querySelector('[data-xpufleet=workers-panel]').dataset.refreshes > {refreshes}",
                           timeout=WAIT_MS)  # refreshed while open
    page.screenshot(path=str(screenshots / "comfy-workers-panel.png"))
    card.locator("[data-xpufleet=drain]").click()
    card.locator("[data-xpufleet=worker-status]", has_text="Draining").wait_for(timeout=WAIT_MS)
    assert comfy_fleet.call("GET", "/api/workers/gpu-box")["drained"] is True
    try:
        page.click("[data-xpufleet=queue-on]")
        dialog = page.locator("[data-xpufleet=queue-dialog]")
        option = dialog.locator("[data-target='worker:gpu-box']")
        option.wait_for(timeout=WAIT_MS)
        assert option.is_disabled()  # listed, not selectable
        assert "Draining" in dialog.locator("[data-status=Draining]").inner_text()
        assert dialog.locator("[data-target=any]").count() == 0  # no connected worker takes runs
        page.screenshot(path=str(screenshots / "comfy-queue-on-draining.png"))
        page.keyboard.press("Escape")
        dialog.wait_for(state="detached", timeout=WAIT_MS)
    finally:
        comfy_fleet.call("POST", "/api/workers/gpu-box/undrain", {})
    card.locator("[data-xpufleet=worker-status]", has_text="Online").wait_for(timeout=WAIT_MS)


def test_texts_in_chinese_and_labelled_controls(session):
    page, _ = session
    bh.load_api_graph(page, MODEL_GRAPH, "models-zh")
    page.evaluate("() => app.extensionManager.setting.set('XPUFleet.Language', 'zh')")
    try:
        page.wait_for_function("() => document.querySelector('[data-xpufleet=capsule]').innerText.includes('轻松')",
                               timeout=WAIT_MS)
        assert "空闲" in bh.capsule(page)["vram"]
        # every control of ours has a name a screen reader can say
        unnamed = page.evaluate("""() => [...document.querySelectorAll('.xf-root button, .xf-root input, .xf-root select')]
            .filter((el) => el.offsetParent !== null)
            .filter((el) => !(el.getAttribute('aria-label') || el.innerText.trim() || (el.labels && el.labels.length)
                              || el.getAttribute('title')))
            .map((el) => el.outerHTML.slice(0, 120))""")
        assert unnamed == []
    finally:
        page.evaluate("() => app.extensionManager.setting.set('XPUFleet.Language', 'en')")


def test_the_settings_panel_holds_the_plugins_settings(session, comfy_fleet, screenshots):
    page, _ = session
    page.evaluate("() => app.extensionManager.command.execute('Comfy.ShowSettingsDialog')")
    bh.settings_category(page, "XPU Fleet").click(timeout=WAIT_MS)
    status = page.locator("[data-xpufleet=sidecar-status]")
    status.filter(has_text=f"running at {comfy_fleet.url}").wait_for(timeout=WAIT_MS)
    for name in ("device to predict for", "capsule refresh interval", "show the RAM capsule", "language",
                 "start the sidecar when none runs"):
        assert page.get_by_text(f"XPU Fleet: {name}").count() == 1, name
    page.screenshot(path=str(screenshots / "comfy-settings.png"))
    ram = page.locator("[data-xpufleet=ram]")
    switch = page.get_by_role("switch", name="XPU Fleet: show the RAM capsule")
    switch.click()
    ram.wait_for(state="hidden", timeout=WAIT_MS)
    switch.click()
    ram.wait_for(state="visible", timeout=WAIT_MS)
    page.keyboard.press("Escape")


def test_no_console_error_beyond_comfyuis_own_baseline(session, playwright_browser, bare_comfy, comfy_fleet):
    """Measured in this test: the same ComfyUI without the plugin, the same settings, one page load."""
    _, log = session
    with bh.comfy_page(playwright_browser, bare_comfy, {"Comfy.TutorialCompleted": True}, plugin=False) as (page, baseline):
        bh.load_api_graph(page, MODEL_GRAPH, "models")
        page.wait_for_timeout(3000)  # the same seconds of idle page as the plugin's capsule refresh
    assert log.beyond(baseline) == [], (log.errors, baseline.errors)
