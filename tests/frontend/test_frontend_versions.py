"""The plugin on whichever ComfyUI front end COMFYUI_DIR/COMFYUI_PYTHON give (issue 31; docs/comfyui.md,
"Front-end versions"): 1.27 draws its own Queue on... button after the Run group, 1.3x-1.5x draws it from
the extension's actionBarButtons; a template opened from the Templates browser lands drawn (not in LiteGraph's
low-quality boxes); every option of the plugin's settings has a value; the Runs panel after a run, and after
a canvas Run cancelled with ComfyUI's own interrupt (a cancel, not a failure, on every version).

Screenshots carry the front end's version: fe-<version>-topbar.png, fe-<version>-template.png,
fe-<version>-runs-panel.png, fe-<version>-settings-device.png, fe-<version>-canvas-cancel.png (conftest.py
prints where)."""

from __future__ import annotations

import time

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

from xpufleet.constants import SAMPLES_DIR
from xpufleet.server.comfy.make_templates import sample_graphs

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"Comfy.TutorialCompleted": True, "XPUFleet.Language": "en", "XPUFleet.Predict.Device": "gpu-box/cuda:0"}
GRAPHS = sample_graphs(bh.REPO / SAMPLES_DIR)


@pytest.fixture(scope="module")
def session(playwright_browser, comfy_host, comfy_fleet):
    with bh.comfy_page(playwright_browser, comfy_host, SETTINGS) as (page, log):
        version = page.evaluate("() => window.__COMFYUI_FRONTEND_VERSION__ || 'unknown'")
        yield page, log, version


def shot(screenshots, version: str, what: str) -> str:
    return str(screenshots / f"fe-{version}-{what}.png")


def test_queue_on_sits_beside_run_in_a_styled_button(session, screenshots):
    page, _, version = session
    facts = page.evaluate("""() => {
        const q = document.querySelector('[data-xpufleet=queue-on]');
        const run = [...document.querySelectorAll('.comfyui-queue-button button, .queue-button-group button')]
            .find((b) => b.innerText.trim() === 'Run');
        const bar = q.closest('.actionbar-container, .actionbar, .actionbar-content');
        const plain = document.body.appendChild(document.createElement('button'));
        const look = (b) => { const s = getComputedStyle(b); return [s.backgroundColor, s.borderTopStyle, s.color].join(' / '); };
        const out = {native: !!q.closest('[data-testid=action-bar-buttons]'), legacy: q.classList.contains('xf-queue-legacy'),
                     text: q.innerText.trim(), sameBar: !!bar && bar.contains(run), look: look(q), plain: look(plain),
                     hasActionBarButtons: !!document.querySelector('[data-testid=action-bar-buttons]')};
        plain.remove();
        return out; }""")
    assert facts["text"] == "Queue on…"
    # the front end's own button where it offers actionBarButtons, ours (styled by xpufleet.css) where not
    assert facts["native"] == facts["hasActionBarButtons"] and facts["legacy"] != facts["native"], facts
    assert facts["sameBar"], facts  # in the action bar with Run
    assert facts["look"] != facts["plain"], facts  # not the browser's unstyled grey button
    box = page.locator(".actionbar-container, .actionbar, .actionbar-content").first.bounding_box()
    page.screenshot(path=shot(screenshots, version, "topbar"),
                    clip={"x": 0, "y": 0, "width": 1500, "height": max(60, box["y"] + box["height"] + 8)})
    page.click("[data-xpufleet=queue-on]")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    dialog.get_by_role("button", name="Cancel").click(timeout=WAIT_MS)
    dialog.wait_for(state="hidden", timeout=WAIT_MS)


def open_template(page, name: str) -> None:
    bh.templates_button(page).click()
    dialog = page.locator(".p-dialog, [role=dialog]", has_text="XPU Fleet").first
    dialog.get_by_role("option", name="XPU Fleet").or_(dialog.get_by_role("button", name="XPU Fleet", exact=True)) \
        .first.click(timeout=WAIT_MS)
    dialog.locator(f"[data-testid=template-workflow-{name}]").click(timeout=WAIT_MS)
    dialog.wait_for(state="hidden", timeout=WAIT_MS)
    page.wait_for_function(f"() => app.graph.nodes.filter((n) => !n.isVirtualNode).length === {len(GRAPHS[name])}",
                           timeout=WAIT_MS)


def test_a_template_opens_drawn_at_a_readable_zoom(session, screenshots):
    page, log, version = session
    mark = len(log.errors)
    open_template(page, "mlp_digits")
    # the view settles (the front end frames a template a few frames after the load; the plugin then
    # re-frames it when that is below LiteGraph's low-quality zoom): no longer low quality, the top-left
    # node on screen
    page.wait_for_function("""() => { const c = app.canvas; const low = c._lowQualityZoomThreshold || 0.6;
        return c.ds.scale >= low && !c.low_quality; }""", timeout=WAIT_MS)
    page.wait_for_timeout(1600)  # past the plugin's settle window (90 frames): the view stays readable
    view = page.evaluate("""() => { const c = app.canvas, r = c.canvas.getBoundingClientRect();
        const first = app.graph.nodes.filter((n) => !n.isVirtualNode).sort((a, b) => a.pos[0] - b.pos[0] || a.pos[1] - b.pos[1])[0];
        const [x, y] = c.ds.convertOffsetToCanvas(first.pos);
        return {scale: c.ds.scale, low: c.low_quality, threshold: c._lowQualityZoomThreshold, x, y, w: r.width, h: r.height,
                reframed: c.canvas.dataset.xfReadable || null}; }""")
    assert not view["low"] and view["scale"] >= (view["threshold"] or 0.6), view
    assert 0 <= view["x"] < view["w"] and 0 <= view["y"] < view["h"], view
    page.screenshot(path=shot(screenshots, version, "template"))
    assert log.errors[mark:] == []


def test_every_option_of_the_plugin_settings_has_a_value(session, screenshots):
    page, log, version = session
    mark = len(log.errors)
    options = page.evaluate("""() => { const s = app.ui.settings.settingsLookup;
        return Object.values(s).filter((x) => String(x.id).startsWith('XPUFleet.') && x.options)
            .map((x) => [x.id, (typeof x.options === 'function' ? x.options(undefined) : x.options)
                .map((o) => typeof o === 'object' ? o.value : o)]); }""")
    assert dict(options).keys() >= {"XPUFleet.Predict.Device", "XPUFleet.Language"}
    assert all(v not in ("", None) for _, values in options for v in values), options
    # the settings dialog's device setting: opens with its value shown and no console error (1.58's select
    # refused an option with an empty value)
    page.evaluate("() => app.extensionManager.command.execute('Comfy.ShowSettingsDialog')")
    search = page.locator(".settings-container input, [role=dialog] input[placeholder*=earch]").first
    search.fill("device to predict", timeout=WAIT_MS)
    # the select shows the value and opens on its options, "auto" first (PrimeVue's Select on 1.27, reka-ui's on 1.5x)
    page.get_by_role("combobox").filter(has_text="gpu-box/cuda:0").first.click(timeout=WAIT_MS)
    page.get_by_role("option", name="auto", exact=True).first.wait_for(timeout=WAIT_MS)
    page.screenshot(path=shot(screenshots, version, "settings-device"))
    page.keyboard.press("Escape")  # the select closes, then the dialog (its close button on 1.27's PrimeVue)
    page.get_by_role("option", name="auto", exact=True).first.wait_for(state="hidden", timeout=WAIT_MS)
    close = page.locator(".p-dialog-close-button")
    if close.count():
        close.first.click()
    else:
        page.keyboard.press("Escape")
    page.locator(".p-dialog-mask, [role=dialog]").first.wait_for(state="hidden", timeout=WAIT_MS)
    assert [e for e in log.errors[mark:] if "SelectItem" in e or "pageerror" in e] == []


def test_the_runs_panel_after_a_queued_run(session, comfy_fleet, screenshots):
    page, _, version = session
    bh.load_api_graph(page, bh.sidecar_harness.iris_graph(epochs=2), "iris-fe")
    page.click("[data-xpufleet=queue-on]")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    dialog.locator("[data-target='worker:gpu-box']").check(timeout=WAIT_MS)
    dialog.locator("[data-xpufleet=queue-submit]").click()
    runs = page.locator("[data-xpufleet=runs-panel]")
    runs.or_(dialog.locator("[data-xpufleet=queue-error]:not(:empty)")).first.wait_for(timeout=WAIT_MS)
    assert runs.is_visible(), dialog.locator("[data-xpufleet=queue-error]").inner_text()
    runs.locator("[data-xpufleet=detail-status]").filter(has_text="succeeded").wait_for(timeout=WAIT_MS * 2)
    runs.locator("[data-xpufleet=chart][data-drawn=true]").wait_for(timeout=WAIT_MS)
    page.screenshot(path=shot(screenshots, version, "runs-panel"))


def running_canvas_run(fleet, timeout_s: float) -> str:
    """The id of the canvas run the sidecar lists as running (the plugin posts its first events within
    0.5 s of the node's start); a bounded poll, as a run list has no push channel."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        runs = fleet.call("GET", "/api/runs?source=canvas&status=running")["runs"]
        if runs:
            return runs[0]["id"]
        time.sleep(0.2)
    raise AssertionError(f"no running canvas run after {timeout_s} s")


def test_a_canvas_run_cancelled_in_comfyui_is_cancelled_in_the_runs_panel(session, comfy_host, comfy_fleet,
                                                                          screenshots):
    """ComfyUI's Run on a training graph, then ComfyUI's own interrupt (what its Cancel button sends): the
    canvas run ends ``cancelled`` with its interrupt checkpoint, never ``failed`` (ComfyUI 0.33's interrupt
    derives from BaseException), and the Runs panel shows it so."""
    page, log, version = session
    mark = len(log.errors)
    bh.load_api_graph(page, bh.sidecar_harness.iris_graph(epochs=10**6), f"canvas-cancel-{version}")
    bh.run_button(page).click(timeout=WAIT_MS)
    try:
        run_id = running_canvas_run(comfy_fleet, bh.WAIT_S)
        comfy_fleet.sidecar.wait_for(run_id, "metric", bh.WAIT_S)  # it trains
        page.evaluate("() => window.app.api.interrupt()")  # what ComfyUI's Cancel button calls
        run = comfy_fleet.sidecar.finish(run_id, timeout=bh.WAIT_S)
    finally:  # a run of a million epochs must not outlive this test, whatever failed above
        comfy_host.request("POST", "/interrupt", {})
    assert run["status"] == "cancelled", (run["status"], run["error"])
    events = comfy_fleet.sidecar.client.events(run_id, limit=1000)["events"]
    assert [e for e in events if e["type"] == "artifact" and e["payload"]["path"].endswith("interrupt.pt")], events[-5:]
    page.evaluate("() => app.extensionManager.command.execute('XPUFleet.ShowRuns')")
    runs = page.locator("[data-xpufleet=runs-panel]")
    row = runs.locator(f".xf-run-row[data-run-id='{run_id}']")
    row.wait_for(timeout=WAIT_MS)
    row.click()
    runs.locator("[data-xpufleet=detail-status]").filter(has_text="cancelled").wait_for(timeout=WAIT_MS)
    # and its row, once the list's next answer lands (a panel left open from a run shows it running until then)
    runs.locator(f".xf-run-row[data-run-id='{run_id}'][data-status='cancelled']").wait_for(timeout=WAIT_MS)
    page.screenshot(path=shot(screenshots, version, "canvas-cancel"))
    assert [e for e in log.errors[mark:] if "RunStopped" in e or "execution_error" in e] == []
