"""The standalone page (issue 20, point 8): its texts come from the plugin's locales/ files, its language
list has no "Follow ComfyUI" (there is no ComfyUI here), the page's tabs are its one navigation, and a
dropped graph file's name shows in the file picker too. Debian's Chromium, a real sidecar and agent."""

from __future__ import annotations

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Predict.Device": "gpu-box/cuda:0", "XPUFleet.Capsule.RefreshSeconds": 2, "XPUFleet.Language": "en"}
GRAPH = {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "small.safetensors"}}}


@pytest.fixture(scope="module")
def page_and_log(playwright_browser, standalone_fleet):
    with bh.standalone_page(playwright_browser, standalone_fleet, SETTINGS, "light") as page_and_log:
        yield page_and_log


def test_a_dropped_file_shows_in_the_picker_and_stays_across_a_language_change(page_and_log, screenshots):
    page, _ = page_and_log
    bh.drop_graph(page, "small.json", GRAPH)
    picked = "() => { const i = document.querySelector('[data-xpufleet=file-input]'); return i.files.length ? i.files[0].name : ''; }"
    page.wait_for_function(f"() => ({picked})() === 'small.json'", timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "standalone-dropped-file-light.png"), clip={"x": 0, "y": 0, "width": 1400, "height": 140})
    # the settings' language list: the browser's language, Chinese, English; nothing about ComfyUI
    page.locator("[data-xpufleet=settings-button]").click()
    language = page.locator("[data-xpufleet=settings] select").first
    options = language.locator("option").all_inner_texts()
    assert options == ["Follow the browser", "中文", "English"], options
    language.select_option("zh")
    try:
        page.locator("[data-xpufleet=queue-on]", has_text="排入队列…").wait_for(timeout=WAIT_MS)
        assert page.evaluate(picked) == "small.json"  # the page was rebuilt in Chinese; the file stayed
        # the settings dialog the choice came from is open again, in Chinese
        assert page.locator("[data-xpufleet=settings] select").first.locator("option").first.inner_text() == "跟随浏览器"
        page.screenshot(path=str(screenshots / "standalone-settings-zh-light.png"))
    finally:
        page.locator("[data-xpufleet=settings] select").first.select_option("en")
        page.keyboard.press("Escape")
    page.locator("[data-xpufleet=queue-on]", has_text="Queue on…").wait_for(timeout=WAIT_MS)


def test_the_tabs_are_the_one_navigation(page_and_log, screenshots):
    page, _ = page_and_log
    for tab, panel in (("runs", "runs-panel"), ("sweeps", "sweeps-panel"), ("workers", "workers-panel")):
        page.locator(f"[data-xpufleet=tab-{tab}]").click()
        page.locator(f"[data-xpufleet={panel}]").wait_for(timeout=WAIT_MS)
        # the panels' own "open the other panel" buttons (ComfyUI's bottom panel needs them) are not shown
        shown = page.evaluate("""() => [...document.querySelectorAll('[data-xpufleet^=open-]')]
            .filter((el) => el.offsetParent !== null).map((el) => el.dataset.xpufleet)""")
        assert shown == [], (tab, shown)
        names = page.get_by_role("button", name="Workers", exact=True).count() + page.get_by_role("tab", name="Workers").count()
        assert names == 1, tab  # the Workers tab only
    page.locator("[data-xpufleet=tab-runs]").click()
    page.screenshot(path=str(screenshots / "standalone-tabs-light.png"), clip={"x": 0, "y": 0, "width": 1400, "height": 220})


def test_no_console_error_or_failed_request(page_and_log):
    _, log = page_and_log
    assert log.beyond(bh.ConsoleLog()) == [] and log.failed == [], (log.errors, log.failed)
