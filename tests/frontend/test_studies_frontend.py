"""The Studies panel (issue 20, point 6) on the standalone page and inside the real ComfyUI: an Optuna
study of POST /api/studies on a small iris graph, opened from its tab as a user does: the list, the best
trial, the optimization history (each trial's value and the best so far), the parameter against the
objective on a log axis, the trials table with a running trial's progress, and Cancel. A real sidecar and
an agent simulating CUDA cards; Chromium; no failed request and no console error on the way."""

from __future__ import annotations

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Language": "en", "XPUFleet.Capsule.RefreshSeconds": 5}


def study_body(name: str, epochs: int, n_trials: int, device: str) -> dict:
    return {"name": name, "graph": bh.sidecar_harness.iris_graph(epochs=epochs),
            "parameters": {"5.lr": {"low": 0.001, "high": 0.3, "log": True}},
            "n_trials": n_trials, "parallel": 1, "objective": {"metric": "val_accuracy", "direction": "maximize"},
            "sampler": {"type": "random", "seed": 3}, "options": {"target": {"worker": "gpu-box", "devices": [device]}}}


def wait_study(fleet, study_id: str, status: str) -> dict:
    deadline_polls = 40  # each long poll waits up to 10 s for a change: bounded
    study = fleet.call("GET", f"/api/studies/{study_id}")
    for _ in range(deadline_polls):
        if study["status"] == status:
            return study
        study = fleet.call("GET", f"/api/studies/{study_id}?version={study['version']}&wait=10")
    raise AssertionError(f"study {study_id} is {study['status']}, not {status}")


def check_study_detail(page, detail, server: dict) -> None:
    """The page shows the server's study: the best trial, every trial's row, the two charts."""
    best = server["best_trial"]
    detail.locator("[data-xpufleet=study-status][data-status=finished]").wait_for(timeout=WAIT_MS)
    assert detail.locator("[data-xpufleet=study-best]").inner_text().startswith(f"Best trial: #{best['number']} Optimizer lr=")
    rows = detail.locator("[data-xpufleet=study-table] tbody tr")
    rows.nth(len(server["trials"]) - 1).wait_for(timeout=WAIT_MS)
    shown = [(int(rows.nth(i).get_attribute("data-trial")), rows.nth(i).get_attribute("data-state")) for i in range(rows.count())]
    assert shown == [(t["number"], t["state"]) for t in server["trials"]]
    complete = [t for t in server["trials"] if t["state"] == "complete"]
    history = detail.locator(f"[data-xpufleet=study-history][data-drawn=true][data-points='{len(complete)}']")
    history.wait_for(timeout=WAIT_MS)
    assert float(history.get_attribute("data-best")) == best["value"]
    scatter = detail.locator(f"[data-xpufleet=study-scatter][data-drawn=true][data-points='{len(complete)}']")
    scatter.wait_for(timeout=WAIT_MS)
    lrs = [t["parameters"]["5.lr"] for t in complete]
    assert scatter.get_attribute("data-scale") == ("log" if max(lrs) / min(lrs) > 10 else "linear")


@pytest.fixture(scope="module")
def console():
    return bh.ConsoleLog()


@pytest.fixture(scope="module")
def page(playwright_browser, standalone_fleet, console):
    with bh.standalone_page(playwright_browser, standalone_fleet, SETTINGS, log=console) as (page, _log):
        yield page


def test_a_finished_study_its_best_trial_history_and_trials(page, standalone_fleet, console, screenshots):
    created = standalone_fleet.call("POST", "/api/studies", study_body("iris-lr-study", 3, 3, "cuda:0"))
    server = wait_study(standalone_fleet, created["study_id"], "finished")
    assert server["counts"] == {"complete": 3}, server["counts"]
    page.click("[data-xpufleet=tab-studies]")
    panel = page.locator("[data-xpufleet=studies-panel]")
    panel.locator(f"[data-study-id='{created['study_id']}'] button").click(timeout=WAIT_MS)
    detail = panel.locator("[data-xpufleet=study-detail]")
    check_study_detail(page, detail, server)
    assert "★" in detail.locator(f"tr[data-trial='{server['best_trial']['number']}']").inner_text()
    page.screenshot(path=str(screenshots / "standalone-study-finished.png"))
    # the toggle of the parameter plot's axis
    scale = detail.locator("[data-xpufleet=study-plot-scale]")
    other = "linear" if scale.input_value() == "log" else "log"
    scale.select_option(other)
    detail.locator(f"[data-xpufleet=study-scatter][data-scale={other}][data-drawn=true]").wait_for(timeout=WAIT_MS)
    # a trial's run opens in the Runs panel
    run_id = server["trials"][0]["run_id"]
    detail.locator("[data-xpufleet=study-table] tbody tr").first.locator("button.xf-link").click()
    page.locator(f"[data-xpufleet=runs-panel] .xf-run-row.xf-selected[data-run-id='{run_id}']").wait_for(timeout=WAIT_MS)
    assert console.failed == [] and console.errors == [], (console.failed, console.errors)


def test_a_running_trials_progress_and_cancel(page, standalone_fleet, console, screenshots):
    created = standalone_fleet.call("POST", "/api/studies", study_body("iris-forever", 100000, 4, "cuda:1"))
    page.click("[data-xpufleet=tab-studies]")
    panel = page.locator("[data-xpufleet=studies-panel]")
    panel.locator(f"[data-study-id='{created['study_id']}'] button").click(timeout=WAIT_MS)
    detail = panel.locator("[data-xpufleet=study-detail]")
    progress = detail.locator("[data-xpufleet=sweep-progress]").first
    progress.wait_for(timeout=WAIT_MS)
    assert "epoch" in progress.inner_text()
    page.screenshot(path=str(screenshots / "standalone-study-running.png"))
    detail.locator("[data-xpufleet=study-cancel]").click()
    detail.locator("[data-xpufleet=study-status][data-status=cancelled]").wait_for(timeout=WAIT_MS * 2)
    server = standalone_fleet.call("GET", f"/api/studies/{created['study_id']}")
    assert server["status"] == "cancelled"
    for t in server["trials"]:
        if t["run_id"]:
            assert standalone_fleet.call("GET", f"/api/runs/{t['run_id']}")["status"] not in ("queued", "assigned", "running")
    assert detail.locator("[data-xpufleet=study-delete]").is_visible()
    page.screenshot(path=str(screenshots / "standalone-study-cancelled.png"))
    assert console.failed == [] and console.errors == [], (console.failed, console.errors)


def test_the_studies_tab_inside_comfyui(playwright_browser, comfy_host, comfy_fleet, screenshots):
    """The Studies bottom-panel tab, opened from ComfyUI's panel tabs, through ComfyUI's proxy."""
    created = comfy_fleet.call("POST", "/api/studies", study_body("comfy-study", 2, 2, "cuda:0"))
    server = wait_study(comfy_fleet, created["study_id"], "finished")
    with bh.comfy_page(playwright_browser, comfy_host, {"Comfy.TutorialCompleted": True, "XPUFleet.Language": "en"}, height=1000) as (page, log):
        page.evaluate("() => app.extensionManager.command.execute('XPUFleet.ShowSweeps')")
        page.locator("[data-xpufleet=sweeps-panel]").wait_for(timeout=WAIT_MS)
        page.get_by_role("tab", name="Studies").click(timeout=WAIT_MS)  # the bottom panel's own tab
        panel = page.locator("[data-xpufleet=studies-panel]")
        panel.locator(f"[data-study-id='{created['study_id']}'] button").click(timeout=WAIT_MS)
        check_study_detail(page, panel.locator("[data-xpufleet=study-detail]"), server)
        page.screenshot(path=str(screenshots / "comfy-study.png"))
        assert [f for f in log.failed if "xpufleet" in f] == [], log.failed
        assert [e for e in log.errors if "xpufleet" in e.lower()] == [], log.errors
