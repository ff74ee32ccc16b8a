"""The Runs panel as a user lives in it (issue 20, point 5; docs/runs-panel.md), on the standalone page:
rows that tell four runs of one name apart (source, start, duration, final objective), a finished run's
chart with loss, accuracy and throughput on their own axes and the legends' values on hover, a file
downloaded from its link, and a worker's run's log while it trains and its files through the agent. A
real sidecar and an agent simulating CUDA cards (tests/frontend/conftest.py); Debian's Chromium."""

from __future__ import annotations

import math

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest
from playwright.sync_api import expect

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Predict.Device": "", "XPUFleet.Language": "en"}


@pytest.fixture(scope="module")
def page(playwright_browser, standalone_fleet):
    with bh.standalone_page(playwright_browser, standalone_fleet, SETTINGS) as (page, log):
        yield page
    assert log.errors == [], log.errors  # no console error through these tests
    assert log.failed == [], log.failed  # and no failed request


def open_run(page, run_id: str):
    page.click("[data-xpufleet=tab-runs]")
    runs = page.locator("[data-xpufleet=runs-panel]")
    runs.locator(f"[data-run-id='{run_id}'] .xf-run-pick").click(timeout=WAIT_MS)
    return runs


def close_enough(shown: str, value: float) -> bool:
    """The page shows 4 significant digits (web/lib/format.mjs ``num``)."""
    return math.isclose(float(shown), value, rel_tol=5e-4, abs_tol=1e-12)


@pytest.fixture(scope="module")
def finished(standalone_fleet):
    """Four runs named alike: three here, one on gpu-box, each finished."""
    sc = standalone_fleet.sidecar
    ids = [sc.submit(bh.sidecar_harness.iris_graph(epochs), name="mlp_digits", target=target)
           for epochs, target in ((3, {"worker": "local"}), (2, {"worker": "local"}), (4, {"worker": "local"}),
                                  (3, {"worker": "gpu-box", "devices": ["cuda:0"]}))]
    runs = [sc.finish(rid, timeout=bh.WAIT_S * 2) for rid in ids]
    assert all(r["status"] == "succeeded" for r in runs), [r["error"] for r in runs]
    return runs


def test_four_runs_of_one_name_show_source_start_duration_and_final_objective(page, standalone_fleet, finished,
                                                                              screenshots):
    open_run(page, finished[0]["id"])
    runs = page.locator("[data-xpufleet=runs-panel]")
    texts = []
    for run in finished:
        server = standalone_fleet.call("GET", f"/api/runs/{run['id']}")
        row = runs.locator(f"[data-run-id='{run['id']}'] [data-xpufleet=run-meta]")
        row.locator("[data-xpufleet=run-objective]").wait_for(timeout=WAIT_MS)
        source = row.locator("[data-xpufleet=run-source]")
        assert source.get_attribute("data-source") == server.get("source", "api")
        assert source.inner_text() == "API"
        assert row.locator("[data-xpufleet=run-start]").inner_text().startswith("started ")
        took = row.locator("[data-xpufleet=run-took]").inner_text()
        assert took.startswith("took ") and took.endswith(" s"), took
        objective = server["objective"]
        assert objective["metric"] == "val_accuracy"  # the server's pick: validation accuracy first
        name, value = row.locator("[data-xpufleet=run-objective]").inner_text().split(" ")
        assert name == "val_accuracy" and close_enough(value, objective["value"])
        texts.append(runs.locator(f"[data-run-id='{run['id']}']").inner_text())
    assert len(set(texts)) == 4  # four rows named mlp_digits, each told apart
    page.screenshot(path=str(screenshots / "runs-rows-facts.png"))


def panel(runs, group: str):
    return runs.locator(f"[data-xpufleet=chart] .xf-chart-panel[data-group={group}]")


def test_a_finished_runs_chart_keeps_loss_accuracy_and_throughput_apart_with_values_on_hover(
        page, standalone_fleet, finished, screenshots):
    run = finished[0]
    metrics = standalone_fleet.call("GET", f"/api/runs/{run['id']}/metrics")["metrics"]
    assert {"train_loss", "val_loss", "val_accuracy", "samples_per_s", "eval_loss", "eval_accuracy"} <= set(metrics)
    runs = open_run(page, run["id"])
    runs.locator("[data-xpufleet=detail-status]", has_text="succeeded").wait_for(timeout=WAIT_MS)
    chart = runs.locator("[data-xpufleet=chart][data-drawn=true]")
    chart.wait_for(timeout=WAIT_MS)
    assert chart.get_attribute("data-groups") == "loss,accuracy,throughput"
    loss, acc, rate = panel(runs, "loss"), panel(runs, "accuracy"), panel(runs, "throughput")
    assert set(loss.get_attribute("data-series").split(",")) == {"train_loss", "val_loss", "eval_loss"} | (
        {"train_loss_batch", "val_loss_step"} & set(metrics))
    assert acc.get_attribute("data-series") == "val_accuracy,eval_accuracy"
    assert rate.get_attribute("data-series") == "samples_per_s"
    # the loss axis stays near the losses once the run has ended (the throughput never joins it)
    losses = [p["value"] for n, pts in metrics.items() if "loss" in n for p in pts]
    y_max = float(loss.get_attribute("data-y-max"))
    assert max(losses) <= y_max <= max(losses) * 1.5 + 0.1, (y_max, max(losses))
    assert float(loss.get_attribute("data-y-min")) >= min(0.0, min(losses)) - 0.1
    assert (float(acc.get_attribute("data-y-min")), float(acc.get_attribute("data-y-max"))) == (0.0, 1.0)
    assert float(rate.get_attribute("data-y-max")) >= metrics["samples_per_s"][-1]["value"]
    # hover an epoch's end before the last (train_loss, val_loss, val_accuracy and samples_per_s have a point
    # there; train_loss_batch points come every few seconds, so the steps between depend on the machine's speed)
    last_step = max(p["step"] for pts in metrics.values() for p in pts if p.get("step") is not None)
    step_cell = loss.locator(".u-legend .u-series").first.locator(".u-value")
    expect(step_cell).to_have_text(str(last_step), timeout=WAIT_MS)  # the legends show the latest values
    epochs = sorted({p["step"] for p in metrics["val_accuracy"] if p.get("step") is not None})
    assert len(epochs) >= 2 and epochs[-1] == last_step, epochs
    step = epochs[-2]
    box = loss.locator(".u-over").bounding_box()
    x_min, x_max = float(loss.get_attribute("data-x-min")), float(loss.get_attribute("data-x-max"))
    page.mouse.move(box["x"] + box["width"] * (step - x_min) / (x_max - x_min), box["y"] + box["height"] * 0.5)
    for group in ("loss", "accuracy", "throughput"):  # every panel follows the shared cursor
        expect(panel(runs, group).locator(".u-legend .u-series").first.locator(".u-value")).to_have_text(
            str(step), timeout=WAIT_MS)
    checked = set()
    for group in ("loss", "accuracy", "throughput"):
        for row in panel(runs, group).locator(".u-legend .u-series").all()[1:]:
            name = row.locator(".u-label").inner_text()
            shown = row.locator(".u-value").inner_text()
            at = [p["value"] for p in metrics[name] if p.get("step") == step]
            if at:
                assert close_enough(shown, at[-1]), (name, step, shown, at)
                checked.add(name)
            else:  # a series with no point at this step says so
                assert shown == "—", (name, step, shown)
    assert {"train_loss", "val_accuracy"} <= checked, checked
    # colours are the series' own: the legend marker of train_loss is its colour in any run's chart
    marker = loss.locator(".u-legend .u-series", has_text="train_loss").first.locator(".u-marker")
    assert "rgb(22, 119, 255)" in marker.evaluate("(m) => getComputedStyle(m).borderColor + getComputedStyle(m).background")
    page.screenshot(path=str(screenshots / "runs-chart-hover.png"))
    page.mouse.move(5, 5)
    # away from the plots: each legend shows its series' latest value, once the page has handled the move
    for group in ("loss", "accuracy", "throughput"):
        expect(panel(runs, group).locator(".u-legend .u-series").first.locator(".u-value")).to_have_text(
            str(last_step), timeout=WAIT_MS)
    rows = {r.locator(".u-label").inner_text(): r.locator(".u-value").inner_text()
            for r in rate.locator(".u-legend .u-series").all()}
    assert close_enough(rows["samples_per_s"], metrics["samples_per_s"][-1]["value"]), rows
    acc_rows = {r.locator(".u-label").inner_text(): r.locator(".u-value").inner_text()
                for r in acc.locator(".u-legend .u-series").all()[1:]}
    assert close_enough(acc_rows["val_accuracy"], metrics["val_accuracy"][-1]["value"]), acc_rows


def test_a_local_runs_file_downloads_from_its_link(page, standalone_fleet, finished, tmp_path):
    run = finished[1]
    runs = open_run(page, run["id"])
    link = runs.locator("[data-xpufleet=artifacts] [data-xpufleet=artifact-link][data-path='spec.json']")
    link.wait_for(timeout=WAIT_MS)
    assert link.evaluate("(a) => a.tagName") == "A" and link.get_attribute("download") == "spec.json"
    with page.expect_download(timeout=WAIT_MS) as info:
        link.click()
    download = info.value
    assert download.suggested_filename == "spec.json"
    saved = tmp_path / "spec.json"
    download.save_as(saved)
    expected = standalone_fleet.sidecar.client.request("GET", f"/api/runs/{run['id']}/artifacts/spec.json", raw=True)
    assert saved.read_bytes() == expected


def test_a_worker_runs_log_shows_live_and_its_files_download_through_the_agent(page, standalone_fleet, finished,
                                                                              tmp_path, screenshots):
    sc = standalone_fleet.sidecar
    rid = sc.submit(bh.sidecar_harness.iris_graph(10**6), name="endless on gpu-box",
                    target={"worker": "gpu-box", "devices": ["cuda:1"]})
    try:
        sc.wait_for(rid, "run_started", bh.WAIT_S)
        runs = open_run(page, rid)
        runs.locator("[data-xpufleet=detail-status]", has_text="running").wait_for(timeout=WAIT_MS)
        runs.locator("[data-xpufleet=run-detail] summary", has_text="Output log").click()
        log = runs.locator("[data-xpufleet=log][data-where=worker][data-connected=true][data-text=true]")
        log.wait_for(timeout=WAIT_MS)
        first = log.inner_text()
        # live: the box grows while the run trains, with the worker's own bytes
        page.wait_for_function("([el, n]) => el.textContent.length > n",
                               arg=[log.element_handle(), len(first)], timeout=WAIT_MS)
        assert standalone_fleet.call("GET", f"/api/runs/{rid}")["status"] == "running"
        server = standalone_fleet.call("GET", f"/api/runs/{rid}/logs")  # the whole log, from its start
        # the page shows the log's tail (64 KiB, from a whole line): a piece of the worker's own log
        assert server["where"] == "worker" and first.strip() and first.strip() in server["text"]
        grown = log.inner_text().strip()  # what arrived since joins on: no gap, nothing twice
        assert len(grown) > len(first.strip()) and grown in standalone_fleet.call("GET", f"/api/runs/{rid}/logs")["text"]
        log.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshots / "runs-worker-live-log.png"))
    finally:
        standalone_fleet.call("POST", f"/api/runs/{rid}/cancel", {})
    done = finished[3]
    runs = open_run(page, done["id"])
    where = runs.locator("[data-xpufleet=files-where][data-connected=true]")
    assert where.inner_text(timeout=WAIT_MS) == "Kept on worker gpu-box, read through its connection."
    link = runs.locator("[data-xpufleet=artifact-link][data-path='output.log']")
    with page.expect_download(timeout=WAIT_MS) as info:
        link.click()
    saved = tmp_path / "output.log"
    info.value.save_as(saved)
    expected = sc.client.request("GET", f"/api/runs/{done['id']}/artifacts/output.log", raw=True)
    assert saved.read_bytes() == expected and expected  # the worker's file, through the agent
    page.screenshot(path=str(screenshots / "runs-worker-files.png"))


def test_a_worker_runs_log_and_files_say_plainly_when_the_worker_is_not_connected(page, standalone_fleet, finished,
                                                                                 screenshots):
    done = finished[3]
    agent = next(a for a in standalone_fleet.agents if a.name == "gpu-box")
    agent.stop()  # the last test of the module: the worker goes away
    standalone_fleet.wait_worker("gpu-box", "Disconnected")
    runs = open_run(page, done["id"])
    where = runs.locator("[data-xpufleet=files-where][data-connected=false]")
    assert where.inner_text(timeout=WAIT_MS) == ("Kept on worker gpu-box, which is not connected now: the files can "
                                                 "be downloaded when it reconnects.")
    assert runs.locator("[data-xpufleet=artifact-link]").count() == 0  # nothing offered that cannot come
    runs.locator("[data-xpufleet=run-detail] summary", has_text="Output log").click()
    log = runs.locator("[data-xpufleet=log][data-connected=false]")
    assert log.inner_text(timeout=WAIT_MS) == ("The output log is kept on worker gpu-box, which is not connected now: "
                                               "it shows here when the worker reconnects.")
    page.screenshot(path=str(screenshots / "runs-worker-offline.png"))


def test_numbers_keep_the_zeros_of_their_whole_part(page):
    """The CI failure under load: a throughput of 8,340.03 showed as "834" (web/lib/format.mjs ``num`` dropped
    the trailing zeros of "8340", which toPrecision writes without a fraction); it failed whenever a run's
    last throughput rounded to a ten, so it looked like a timing flake."""
    shown = page.evaluate("""async () => {
        const base = document.querySelector('script[type=module]').src;
        const {num} = await import(new URL('../lib/format.mjs', base));
        return [[8340.03, 4], [100.02, 3], [1000.4, 4], [999.96, 4], [-2500.1, 4], [0.5, 4], [0.93333, 4],
                [123456.7, 4], [120000.5, 3], [1.5e-7, 3], [42, 4], [3.10, 3]].map(([v, d]) => num(v, d));
    }""")
    assert shown == ["8340", "100", "1000", "1000", "-2500", "0.5", "0.9333", "1.235e+5", "1.2e+5", "1.5e-7", "42",
                     "3.1"]


def test_the_row_facts_name_a_canvas_run_and_a_running_or_queued_one_in_both_languages(page):
    """The page's own module (web/lib/runs_panel.mjs), fed the rows the server lists: a canvas run
    (recorded from ComfyUI's Run), one still running, one queued, and a source this page does not know."""
    facts = page.evaluate("""async () => {
        const base = document.querySelector('script[type=module]').src;
        const m = await import(new URL('../lib/runs_panel.mjs', base));
        const i18n = await import(new URL('../lib/i18n.mjs', base));
        const now = 1_700_000_100;
        const rows = [
          {source: 'canvas', status: 'succeeded', created_at: now - 100, started_at: now - 90, finished_at: now - 30,
           objective: {metric: 'val_accuracy', value: 0.93333, direction: 'maximize'}},
          {status: 'running', created_at: now - 20, started_at: now - 12},
          {source: 'api', status: 'queued', created_at: now - 5},
          {source: 'later', status: 'succeeded', created_at: now - 100, started_at: now - 90, finished_at: now - 89.5},
        ];
        const out = {en: rows.map((r) => [m.sourceText(r), m.rowFacts(r, now)])};
        i18n.setLanguage('zh');
        out.zh = rows.map((r) => [m.sourceText(r), m.rowFacts(r, now)]);
        i18n.setLanguage('en');
        return out;
    }""")
    en = facts["en"]
    assert [src for src, _ in en] == ["canvas", "API", "API", "later"]
    assert en[0][1]["took"] == "took 1 min 0 s" and en[0][1]["objective"] == "val_accuracy 0.9333"
    assert en[0][1]["start"].startswith("started ")
    assert en[1][1]["took"] == "running for 12 s" and en[1][1]["objective"] is None
    assert en[2][1]["start"].startswith("queued ") and en[2][1]["took"] is None
    assert en[3][1]["took"] == "took 0.5 s"
    zh = facts["zh"]
    assert [src for src, _ in zh] == ["画布", "API 提交", "API 提交", "later"]
    assert zh[0][1]["took"] == "用时 1 min 0 s" and zh[1][1]["took"] == "已运行 12 s"
