"""The Runs panel inside the real ComfyUI 0.3.64 (issue 20, point 5; docs/runs-panel.md): opened from its
bottom-panel tab, a finished run's chart with its axes apart and the legends' values on hover, a file
downloaded from a plain link through ComfyUI's proxy, and a worker's run's log while it trains, with no
console error and no failed request. A real sidecar and an agent simulating CUDA cards; Debian's
Chromium."""

from __future__ import annotations

import math

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.comfy, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"Comfy.TutorialCompleted": True, "XPUFleet.Language": "en"}


@pytest.fixture(scope="module")
def session(playwright_browser, comfy_host, comfy_fleet):
    with bh.comfy_page(playwright_browser, comfy_host, SETTINGS, height=1000, accept_downloads=True) as (page, log):
        yield page, log


def open_runs_tab(page):
    """The bottom panel's Runs tab, as a user opens it: the sidebar's Toggle Bottom Panel button, then
    the tab's title clicked."""
    runs = page.locator("[data-xpufleet=runs-panel]")
    bottom = page.locator(".bottom-panel")
    if not bottom.is_visible():
        page.locator("button.side-bar-button[aria-label^='Toggle Bottom Panel']").click(timeout=WAIT_MS)
    # ComfyUI writes a tab's title in capitals ("RUNS"): its accessible name, matched without case
    bottom.get_by_role("tab", name="runs").click(timeout=WAIT_MS)
    runs.wait_for(timeout=WAIT_MS)
    return runs


def test_in_comfyui_a_finished_runs_chart_legend_and_download_and_a_worker_runs_live_log(
        session, comfy_fleet, screenshots, tmp_path):
    page, log = session
    sc = comfy_fleet.sidecar
    done = sc.submit(bh.sidecar_harness.iris_graph(3), name="iris in comfy", target={"worker": "local"})
    run = sc.finish(done, timeout=bh.WAIT_S * 2)
    assert run["status"] == "succeeded", run["error"]
    metrics = comfy_fleet.call("GET", f"/api/runs/{done}/metrics")["metrics"]
    runs = open_runs_tab(page)
    runs.locator(f"[data-run-id='{done}'] .xf-run-pick").click(timeout=WAIT_MS)
    runs.locator("[data-xpufleet=detail-status]", has_text="succeeded").wait_for(timeout=WAIT_MS)
    meta = runs.locator(f"[data-run-id='{done}'] [data-xpufleet=run-meta]")
    objective = comfy_fleet.call("GET", f"/api/runs/{done}")["objective"]
    assert meta.locator("[data-xpufleet=run-objective]").inner_text(timeout=WAIT_MS).startswith(objective["metric"])
    chart = runs.locator("[data-xpufleet=chart][data-drawn=true]")
    chart.wait_for(timeout=WAIT_MS)
    assert chart.get_attribute("data-groups") == "loss,accuracy,throughput"
    loss = chart.locator(".xf-chart-panel[data-group=loss]")
    losses = [p["value"] for n, pts in metrics.items() if "loss" in n for p in pts]
    assert max(losses) <= float(loss.get_attribute("data-y-max")) <= max(losses) * 1.5 + 0.1
    loss.scroll_into_view_if_needed()
    box = loss.locator(".u-over").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.98, box["y"] + box["height"] * 0.5)  # the last step
    step = int(loss.locator(".u-legend .u-series").first.locator(".u-value").inner_text())
    acc_rows = chart.locator(".xf-chart-panel[data-group=accuracy] .u-legend .u-series")
    shown = {r.locator(".u-label").inner_text(): r.locator(".u-value").inner_text() for r in acc_rows.all()[1:]}
    expected = [p["value"] for p in metrics["val_accuracy"] if p.get("step") == step]
    assert expected and math.isclose(float(shown["val_accuracy"]), expected[-1], rel_tol=5e-4), (shown, expected)
    page.screenshot(path=str(screenshots / "comfy-runs-chart-hover.png"))
    page.mouse.move(5, 5)
    # a plain link through ComfyUI's proxy (the token stays on ComfyUI's server)
    link = runs.locator("[data-xpufleet=artifact-link][data-path='spec.json']")
    assert link.get_attribute("href") == f"/xpufleet/api/runs/{done}/artifacts/spec.json"
    with page.expect_download(timeout=WAIT_MS) as info:
        link.click()
    saved = tmp_path / "spec.json"
    info.value.save_as(saved)
    assert saved.read_bytes() == sc.client.request("GET", f"/api/runs/{done}/artifacts/spec.json", raw=True)

    # a worker's run: its log, live, through the agent
    live = sc.submit(bh.sidecar_harness.iris_graph(10**6), name="endless in comfy",
                     target={"worker": "gpu-box", "devices": ["cuda:0"]})
    try:
        sc.wait_for(live, "run_started", bh.WAIT_S)
        runs.locator(f"[data-run-id='{live}'] .xf-run-pick").click(timeout=WAIT_MS)
        runs.locator("[data-xpufleet=detail-status]", has_text="running").wait_for(timeout=WAIT_MS)
        runs.locator("[data-xpufleet=run-detail] summary", has_text="Output log").click()
        box = runs.locator("[data-xpufleet=log][data-where=worker][data-connected=true][data-text=true]")
        box.wait_for(timeout=WAIT_MS)
        before = len(box.inner_text())
        page.wait_for_function("([el, n]) => el.textContent.length > n", arg=[box.element_handle(), before],
                               timeout=WAIT_MS)
        text = box.inner_text()
        assert "[xpufleet] train_loss epoch" in text and not text.startswith(("0", "1", "2", "3", "4", "5", "6", "7",
                                                                              "8", "9"))  # whole lines only
        box.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshots / "comfy-runs-worker-log.png"))
    finally:
        comfy_fleet.call("POST", f"/api/runs/{live}/cancel", {})
    sc.finish(live, timeout=bh.WAIT_S)
    # nothing the plugin caused (its requests and scripts all live under /xpufleet/ and
    # /extensions/xpufleet/; ComfyUI's own 404s for absent user files are its baseline)
    ours = [e for e in log.errors + log.failed if "xpufleet" in e]
    assert ours == [], ours
