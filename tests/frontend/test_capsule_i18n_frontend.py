"""The capsule, the language and the look in the real ComfyUI 0.3.64 (issue 20, points 4, 8, 10): a
training graph's capsule, its device menu driven by the mouse and by the keys (the WAI-ARIA menu
button), ComfyUI's language switched in its own settings dialog and every plugin text relabelled at
once, and the light palette's Queue on... button and dialog in ComfyUI's PrimeVue look.

Debian's Chromium, the plugin from custom_nodes/, a real sidecar and an agent simulating two 24 GiB
CUDA cards (gpu-box). Screenshots go to the folder the run prints (conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
GRAPH = json.loads((ROOT / "samples" / "mlp_digits.json").read_text())
SETTINGS = {"Comfy.TutorialCompleted": True, "XPUFleet.Predict.Device": "gpu-box/cuda:0",
            "XPUFleet.Capsule.RefreshSeconds": 2, "XPUFleet.Language": "auto", "Comfy.Locale": "en",
            "Comfy.ColorPalette": "dark"}
WAIT_MS = int(bh.WAIT_S * 1000)


@pytest.fixture(scope="module")
def session(playwright_browser, comfy_host, comfy_fleet):
    """One ComfyUI page for the module with mlp_digits on the canvas, its console recorded."""
    try:
        with bh.comfy_page(playwright_browser, comfy_host, SETTINGS) as (page, log):
            bh.load_api_graph(page, GRAPH, "mlp_digits")
            yield page, log
    finally:
        # ComfyUI keeps settings on its server: the next module starts in English and the dark palette
        bh.comfy_settings(comfy_host, {"Comfy.Locale": "en", "Comfy.ColorPalette": "dark"})


def set_setting(page, sid: str, value) -> None:
    page.evaluate("([k, v]) => app.extensionManager.setting.set(k, v)", [sid, value])


def test_training_graph_capsule_shows_the_static_estimate_and_names_its_device(session, comfy_fleet, screenshots):
    page, _ = session
    # the figure Queue on... suggests for this graph (POST /api/estimates, the sidecar's own estimate)
    for _ in range(3):  # a build past the estimator's time limit (a loaded machine) answers no figure
        answer = comfy_fleet.call("POST", "/api/estimates", {"graph": GRAPH})
        if answer["total_gib"]:
            break
    total = answer["total_gib"]
    assert total and total > 0, answer
    page.wait_for_function("(v) => document.querySelector('[data-xpufleet=capsule]').dataset.mPeak === String(v)",
                           arg=total, timeout=WAIT_MS)
    c = bh.capsule(page)
    assert c["level"] == "smooth" and "!" not in c["text"]  # ModelSaver's file is no unresolved model
    device = page.locator("[data-xpufleet=capsule-device]")
    assert device.is_visible() and device.inner_text() == "on gpu-box cuda:0"
    page.hover("[data-xpufleet=capsule]")
    tip = page.locator("[data-xpufleet=capsule-tooltip]")
    tip.wait_for(state="visible")
    first = tip.locator(":scope > *").first
    assert first.get_attribute("data-xpufleet") == "capsule-sentence"
    assert first.inner_text() == f"Fits: needs about {total:.2f} GiB of 24 GiB on gpu-box cuda:0 (simulated)"
    assert "M_peak" in tip.inner_text()  # the formula's symbols follow the sentence
    page.screenshot(path=str(screenshots / "comfy-capsule-training-tooltip.png"), clip={"x": 300, "y": 0, "width": 1200, "height": 600})
    page.mouse.move(700, 600)


# a checkpoint that is not in the host's models/checkpoints (small.safetensors and big.safetensors are)
MISSING_GRAPH = {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "not_here.safetensors"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 512, "batch_size": 1}},
    "8": {"class_type": "VAEDecode", "inputs": {"samples": ["5", 0], "vae": ["4", 2]}},
    "9": {"class_type": "SaveImage", "inputs": {"images": ["8", 0], "filename_prefix": "missing"}},
}
# issue 30's core-node workflow: it loads no model file at all
NO_WEIGHTS_GRAPH = {
    "1": {"class_type": "EmptyImage", "inputs": {"width": 64, "height": 64, "batch_size": 1, "color": 0}},
    "2": {"class_type": "ImageScale", "inputs": {"image": ["1", 0], "upscale_method": "nearest-exact",
                                                 "width": 128, "height": 128, "crop": "disabled"}},
    "3": {"class_type": "SaveImage", "inputs": {"images": ["2", 0], "filename_prefix": "noweights"}},
}
CAPSULE_IS = "(v) => document.querySelector('[data-xpufleet=capsule]').dataset.level === v"


def test_a_missing_checkpoint_names_the_file_and_shows_no_rate(session, comfy_host, screenshots):
    """Issue 30 point 4: never a green "100% Smooth" for a workflow whose checkpoint is missing."""
    page, _ = session
    bh.load_api_graph(page, MISSING_GRAPH, "missing-checkpoint")
    page.wait_for_function(CAPSULE_IS, arg="missing", timeout=WAIT_MS)
    capsule = page.locator("[data-xpufleet=capsule]")
    c = bh.capsule(page)
    assert c["text"].startswith("Missing model: not_here.safetensors (node 4)"), c
    assert "p" not in c and "%" not in c["text"] and "Smooth" not in c["text"] and c["missing"] == "1", c
    # a neutral grey dot and the "!" mark, not a level's colour (green least of all)
    dot = capsule.locator(".xf-dot").evaluate("(d) => getComputedStyle(d).backgroundColor")
    assert dot == "rgb(140, 140, 140)", dot
    assert capsule.locator(".xf-badge").count() == 1
    assert "no success rate" in capsule.get_attribute("aria-label")
    page.hover("[data-xpufleet=capsule]")
    tip = page.locator("[data-xpufleet=capsule-tooltip]")
    tip.wait_for(state="visible")
    sentence = tip.locator("[data-xpufleet=capsule-sentence]").inner_text()
    assert sentence.startswith("No success rate:") and "gpu-box cuda:0" in sentence, sentence
    item = tip.locator("[data-xpufleet=capsule-missing] li")
    assert item.count() == 1
    assert item.first.inner_text().startswith(
        "not_here.safetensors — node 4 (CheckpointLoaderSimple.ckpt_name), folder checkpoints")
    places = item.first.locator("[data-xpufleet=missing-places]").inner_text()
    assert places.startswith("ComfyUI looks in: ") and str(comfy_host.base / "models" / "checkpoints") in places
    text = tip.inner_text()
    assert "P_success" not in text and "%" not in text and "needs about" not in text
    # no file of it was found: no "needs at least 0.00 GiB" either
    assert tip.locator("[data-xpufleet=capsule-lower-bound]").inner_text().startswith("None of the workflow's model files")
    page.screenshot(path=str(screenshots / "comfy-capsule-missing-model.png"),
                    clip={"x": 0, "y": 0, "width": 1300, "height": 520})
    page.mouse.move(700, 600)
    # the user picks a checkpoint the host has on the canvas: the rate comes back, seed 001's for its 2 GiB
    bh.choose_combo(page, "CheckpointLoaderSimple", "ckpt_name", "small.safetensors")
    page.wait_for_function("() => document.querySelector('[data-xpufleet=capsule]').dataset.mPeak === '2'",
                           timeout=WAIT_MS)
    c = bh.capsule(page)
    assert (c["level"], c["p"]) == ("smooth", "100") and "missing" not in c and "Missing" not in c["text"], c
    # in Chinese too (ComfyUI's language, no reload; it refreshes its node definitions, so no canvas
    # clicks after it here)
    bh.load_api_graph(page, MISSING_GRAPH, "missing-checkpoint")
    page.wait_for_function(CAPSULE_IS, arg="missing", timeout=WAIT_MS)
    set_setting(page, "Comfy.Locale", "zh")
    page.wait_for_function("() => document.querySelector('[data-xpufleet=capsule]').innerText"
                           ".startsWith('缺少模型：not_here.safetensors（节点 4）')", timeout=WAIT_MS)
    set_setting(page, "Comfy.Locale", "en")
    page.wait_for_function("() => document.querySelector('[data-xpufleet=capsule]').innerText.startsWith('Missing model')",
                           timeout=WAIT_MS)


def test_a_workflow_loading_no_model_file_says_so_instead_of_needing_zero(session, screenshots):
    page, _ = session
    bh.load_api_graph(page, NO_WEIGHTS_GRAPH, "no-weights")
    # the answer for this graph (the one before it was a found checkpoint's: basis model_files)
    page.wait_for_function("() => { const c = document.querySelector('[data-xpufleet=capsule]').dataset; "
                           "return c.basis === 'none' && c.level === 'smooth'; }", timeout=WAIT_MS)
    c = bh.capsule(page)
    assert c["level"] == "smooth" and c["p"] == "100" and "!" not in c["text"], c  # nothing is missing
    page.hover("[data-xpufleet=capsule]")
    tip = page.locator("[data-xpufleet=capsule-tooltip]")
    tip.wait_for(state="visible")
    sentence = tip.locator("[data-xpufleet=capsule-sentence]").inner_text()
    assert sentence.startswith("Loads no model files") and "needs about" not in sentence, sentence
    page.screenshot(path=str(screenshots / "comfy-capsule-no-model-files.png"),
                    clip={"x": 0, "y": 0, "width": 1300, "height": 520})
    page.mouse.move(700, 600)
    # the training graph again for the tests that follow
    bh.load_api_graph(page, GRAPH, "mlp_digits")
    page.wait_for_function("() => document.querySelector('[data-xpufleet=capsule]').dataset.basis === "
                           "'training_estimate'", timeout=WAIT_MS)


def focused(page) -> str:
    return page.evaluate("() => { const a = document.activeElement; return a.dataset.value || a.dataset.xpufleet || a.tagName; }")


def test_capsule_menu_by_mouse_and_by_keys(session, screenshots):
    page, _ = session
    capsule = page.locator("[data-xpufleet=capsule]")
    menu = page.locator("[data-xpufleet=device-menu]")
    capsule.click()
    menu.locator("[data-value='gpu-box/cuda:1']").wait_for(timeout=WAIT_MS)
    assert menu.get_attribute("role") == "menu" and capsule.get_attribute("aria-expanded") == "true"
    items = menu.get_by_role("menuitemradio")
    texts = items.all_inner_texts()
    assert [x for x in texts if x.lower().startswith("this machine")] == [texts[0]] == ["This machine: cpu"], texts  # one entry
    assert items.first.get_attribute("data-value") == "auto"
    assert focused(page) == "gpu-box/cuda:0"  # opens on the checked item
    page.screenshot(path=str(screenshots / "comfy-capsule-menu.png"), clip={"x": 300, "y": 0, "width": 1200, "height": 300})
    page.keyboard.press("ArrowDown")
    assert focused(page) == "gpu-box/cuda:1"
    page.keyboard.press("ArrowDown")  # wraps
    assert focused(page) == "auto"
    page.keyboard.press("ArrowUp")
    assert focused(page) == "gpu-box/cuda:1"
    page.keyboard.press("Home")
    assert focused(page) == "auto"
    page.keyboard.press("End")
    assert focused(page) == "gpu-box/cuda:1"
    page.keyboard.press("Escape")
    menu.wait_for(state="hidden")
    assert focused(page) == "capsule" and capsule.get_attribute("aria-expanded") == "false"
    # from the keyboard alone: ArrowDown on the capsule opens the menu on its first item, Enter picks
    page.keyboard.press("ArrowDown")
    menu.locator("[data-value='gpu-box/cuda:1']").wait_for(timeout=WAIT_MS)
    assert focused(page) == "auto"
    page.keyboard.press("End")
    page.keyboard.press("Enter")
    menu.wait_for(state="hidden")
    assert focused(page) == "capsule"
    page.locator("[data-xpufleet=capsule-device]", has_text="on gpu-box cuda:1").wait_for(timeout=WAIT_MS)
    # ArrowUp opens on the last item; the mouse picks cuda:0 again
    page.keyboard.press("ArrowUp")
    menu.locator("[data-value='gpu-box/cuda:0']").wait_for(timeout=WAIT_MS)
    assert focused(page) == "gpu-box/cuda:1"
    menu.locator("[data-value='gpu-box/cuda:0']").click()
    page.locator("[data-xpufleet=capsule-device]", has_text="on gpu-box cuda:0").wait_for(timeout=WAIT_MS)


def test_a_language_change_in_comfyuis_settings_relabels_everything_at_once(session, screenshots):
    page, _ = session
    page.evaluate("() => app.extensionManager.command.execute('Workspace.ToggleBottomPanelTab.xpufleet-runs')")
    runs = page.locator("[data-xpufleet=runs-panel]")
    runs.wait_for(timeout=WAIT_MS)
    assert "Refresh" in runs.inner_text()
    # the user opens ComfyUI's settings and picks 中文 for its language
    page.evaluate("() => app.extensionManager.command.execute('Comfy.ShowSettingsDialog')")
    page.locator("#Comfy\\.Locale").click(timeout=WAIT_MS)
    page.get_by_role("option", name="中文", exact=True).click(timeout=WAIT_MS)
    # no reload: the capsules, Queue on..., the open panel and the plugin's settings are Chinese
    page.wait_for_function("() => document.querySelector('[data-xpufleet=capsule]').innerText.includes('轻松')", timeout=WAIT_MS)
    assert page.locator("[data-xpufleet=queue-on]").inner_text() == "排入队列…"
    assert page.locator("[data-xpufleet=capsule-device]").inner_text() == "预测设备：gpu-box cuda:0"
    page.locator("[data-xpufleet=runs-panel]", has_text="刷新").wait_for(timeout=WAIT_MS)
    bh.settings_category(page, "XPU Fleet").click(timeout=WAIT_MS)
    for name in ("XPU Fleet：语言", "XPU Fleet：预测的设备", "XPU Fleet：显示内存胶囊"):
        page.get_by_text(name, exact=True).wait_for(timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "comfy-settings-zh.png"))
    page.keyboard.press("Escape")
    page.locator(".p-dialog").wait_for(state="detached", timeout=WAIT_MS)
    page.evaluate("() => document.activeElement?.blur()")
    page.mouse.move(700, 300)
    page.screenshot(path=str(screenshots / "comfy-runs-panel-zh.png"))
    # Queue on... open while the language changes (its modal covers the settings, so set it directly)
    page.locator("[data-xpufleet=queue-on]").click()
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    dialog.get_by_role("heading", name="排入队列…").wait_for(timeout=WAIT_MS)
    dialog.get_by_label("名称").fill("kept across the switch")
    set_setting(page, "Comfy.Locale", "en")
    dialog.get_by_role("heading", name="Queue on…").wait_for(timeout=WAIT_MS)
    assert dialog.get_by_label("Name").input_value() == "kept across the switch"
    page.locator("[data-xpufleet=runs-panel]", has_text="Refresh").wait_for(timeout=WAIT_MS)
    assert "Smooth" in bh.capsule(page)["text"]
    page.screenshot(path=str(screenshots / "comfy-queue-on-relabelled-en.png"))
    page.keyboard.press("Escape")
    dialog.wait_for(state="detached")


def test_canvas_node_names_inputs_and_tooltips_in_chinese(playwright_browser, comfy_host, screenshots):
    """ComfyUI reads locales/zh/nodeDefs.json: a page opened in Chinese names our nodes, their inputs and
    tooltips in Chinese (ComfyUI names the nodes of a page when it loads their definitions)."""
    bh.comfy_settings(comfy_host, {**SETTINGS, "Comfy.Locale": "zh"})
    context = playwright_browser.new_context(viewport={"width": 1500, "height": 950})
    try:
        page = bh.open_comfy(context, comfy_host.url)
        bh.load_api_graph(page, GRAPH, "mlp_digits")
        page.wait_for_function("() => app.graph.nodes.some((n) => n.type === 'XPUOptimizer')", timeout=WAIT_MS)
        node = page.evaluate("""() => { const n = app.graph.nodes.find((x) => x.type === 'XPUOptimizer');
            const lr = n.inputs.find((i) => i.name === 'lr') || {};
            return {title: n.title, lr: n.widgets.find((w) => w.name === 'lr').label, lrInput: lr.localized_name || lr.label,
                    out: (n.outputs[0] || {}).localized_name || (n.outputs[0] || {}).label}; }""")
        # the graph keeps the titles it names (_meta.title); its inputs and outputs are ComfyUI's to name
        assert node["title"] == "Optimizer", node
        assert node["lr"] == "学习率" and node["out"] == "优化器", node
        # a node the user adds (what the node search adds) takes the translated display name and tooltips
        added = page.evaluate("""() => { const n = LiteGraph.createNode('XPUTrainingLoop'); app.graph.add(n);
            n.pos = [40, 40]; const w = n.widgets.find((x) => x.name === 'epochs');
            return {title: n.title, epochs: w.label}; }""")
        assert added["title"] == "训练循环" and added["epochs"] == "epoch 数", added
        # the tooltips ComfyUI shows on hover come from the same merged file (its /i18n answer)
        i18n = page.evaluate("async () => (await (await fetch('/i18n')).json()).zh.nodeDefs.XPUTrainingLoop")
        assert i18n["inputs"]["epochs"]["tooltip"] == "遍历数据加载器的次数"
        page.screenshot(path=str(screenshots / "comfy-canvas-nodes-zh.png"))
    finally:
        context.close()
        bh.comfy_settings(comfy_host, {"Comfy.Locale": "en"})


def css_var(page, name: str, prop: str = "background-color", fallback: str = "") -> str:
    """A ComfyUI theme variable as the browser resolves it (an rgb() string). ``fallback``: the value
    xpufleet.css falls back on where the front end does not define ``name`` (1.58 has no PrimeVue theme
    variables), written as CSS (``var(--comfy-input-bg)``, a colour)."""
    return page.evaluate("""([name, prop, fallback]) => { const el = document.createElement('div');
        el.style.setProperty(prop, fallback ? `var(${name}, ${fallback})` : `var(${name})`); document.body.append(el);
        const v = getComputedStyle(el).getPropertyValue(prop); el.remove(); return v; }""", [name, prop, fallback])


def style(locator, prop: str) -> str:
    return locator.evaluate("(el, p) => getComputedStyle(el).getPropertyValue(p)", prop)


def test_light_palette_keeps_queue_on_and_the_dialog_in_comfyuis_look(session, screenshots):
    page, _ = session
    button = page.locator("[data-xpufleet=queue-on]")
    dark = style(button, "color")
    # a front end with actionBarButtons draws Queue on... itself (its look is the front end's own); 1.27 gets ours
    native = button.evaluate("(b) => !!b.closest('[data-testid=action-bar-buttons]')")
    set_setting(page, "Comfy.ColorPalette", "light")
    try:
        page.wait_for_function("() => document.body.classList.contains('comfy-light') || "
                               "getComputedStyle(document.body).backgroundColor !== 'rgb(0, 0, 0)'", timeout=WAIT_MS)
        page.mouse.move(700, 600)
        page.screenshot(path=str(screenshots / "comfy-light-topbar.png"), clip={"x": 0, "y": 0, "width": 1500, "height": 90})
        if native:  # the front end's button follows its palette (once the colour transitions have ended)
            page.wait_for_function("""(dark) => getComputedStyle(document.querySelector('[data-xpufleet=queue-on]')).color
                !== dark""", arg=dark, timeout=WAIT_MS)
        # the look of a PrimeVue secondary button in this palette, next to ours: the same (once the
        # palette's colour transitions have ended), and unlike the bar
        else:
            page.wait_for_function("""() => { const b = document.querySelector('[data-xpufleet=queue-on]');
                const r = document.createElement('button'); r.className = 'p-button p-component p-button-secondary p-button-sm';
                r.textContent = 'x'; r.style.transition = 'none'; b.parentElement.append(r);
                const [s, t] = [getComputedStyle(r), getComputedStyle(b)];
                const same = ['backgroundColor', 'color', 'borderRadius', 'fontFamily'].every((k) => s[k] === t[k]);
                r.remove(); return same; }""", timeout=WAIT_MS)
            bar = button.evaluate("(b) => getComputedStyle(b.closest('.actionbar') || b.parentElement).backgroundColor")
            assert style(button, "background-color") != bar
        secondary = css_var(page, "--p-button-secondary-background", fallback="var(--comfy-input-bg, #2b2b2b)")
        button.click()
        dialog = page.locator("[data-xpufleet=queue-dialog]")
        dialog.get_by_role("heading", name="Queue on…").wait_for(timeout=WAIT_MS)
        dialog.locator("[data-target='worker:gpu-box']").check()
        name = dialog.get_by_label("Name")
        field = css_var(page, "--p-form-field-background", fallback="var(--comfy-input-bg, #2b2b2b)")
        assert style(name, "background-color") == field
        assert style(name, "border-top-color") == css_var(page, "--p-form-field-border-color", "border-top-color",
                                                          fallback="var(--border-color, #4a4a4a)")
        select = dialog.locator("[data-xpufleet=record-outputs]")
        assert style(select, "background-color") == field
        submit = dialog.locator("[data-xpufleet=queue-submit]")
        assert style(submit, "background-color") == css_var(page, "--p-button-primary-background",
                                                             fallback="var(--p-primary-color, #1677ff)")
        cancel = dialog.get_by_role("button", name="Cancel")
        assert style(cancel, "background-color") == secondary
        # the "*" after a simulated card is explained in the dialog itself
        assert "gpu-box" in dialog.inner_text() and "*" in dialog.inner_text()
        assert dialog.locator("[data-xpufleet=simulated-mark]").inner_text().startswith("*")
        page.screenshot(path=str(screenshots / "comfy-light-queue-on-dialog.png"))
        page.keyboard.press("Escape")
        dialog.wait_for(state="detached")
        # the Runs panel's buttons in the light palette: PrimeVue's secondary look too
        page.evaluate("() => app.extensionManager.command.execute('XPUFleet.ShowRuns')")
        refresh = page.locator("[data-xpufleet=runs-panel]").get_by_role("button", name="Refresh")
        refresh.wait_for(timeout=WAIT_MS)
        assert style(refresh, "background-color") == secondary
        page.screenshot(path=str(screenshots / "comfy-light-runs-panel.png"))
    finally:
        set_setting(page, "Comfy.ColorPalette", "dark")


def test_no_console_error_or_failed_request_from_the_plugin(session, playwright_browser, bare_comfy):
    """Every flow above on one page: no console error beyond the same ComfyUI's without the plugin (one
    page load, the same graph, measured here) and no failed request to the plugin's routes."""
    _, log = session
    with bh.comfy_page(playwright_browser, bare_comfy, {"Comfy.TutorialCompleted": True}, plugin=False) as (page, baseline):
        page.wait_for_timeout(3000)  # the same seconds of idle page as the capsule's refreshes
    # the graph's node types are unknown without the plugin, so the baseline loads no graph
    assert log.beyond(baseline) == [], (log.errors, baseline.errors)
    assert [f for f in log.failed if "/xpufleet" in f] == [], log.failed
