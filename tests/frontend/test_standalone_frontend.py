"""The standalone page at / of the sidecar (docs/comfyui.md), for users without ComfyUI: the login link
of `xpufleet ui`, a dropped graph file in place of the canvas, the capsules, Queue on..., the Runs and
Workers panels, light and dark themes. A real sidecar and agents simulating CUDA cards; Chromium."""

from __future__ import annotations

import json

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

from xpufleet.common.client import ApiError
from xpufleet.server.devices import set_simulated_free

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

REFRESH_S = 2
WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Predict.Device": "gpu-box/cuda:0", "XPUFleet.Capsule.RefreshSeconds": REFRESH_S,
            "XPUFleet.Language": "en"}


def model_graph(name: str) -> dict:
    return {"1": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": name}}}


def new_context(browser, theme: str = "dark"):
    return bh.standalone_context(browser, SETTINGS, theme)


@pytest.fixture(scope="module")
def page_and_log(playwright_browser, standalone_fleet):
    with bh.standalone_page(playwright_browser, standalone_fleet, SETTINGS) as page_and_log:
        yield page_and_log


def drop(page, name: str, graph: dict) -> None:
    bh.drop_graph(page, name, graph)


def wait_capsule(page, condition: str) -> dict:
    page.wait_for_function(f"() => {{ const c = document.querySelector('[data-xpufleet=capsule]').dataset; return {condition}; }}",
                           timeout=WAIT_MS)
    return bh.capsule(page)


def test_the_login_link_works_once_and_leaves_no_cookie(page_and_log, playwright_browser, standalone_fleet):
    page, _ = page_and_log
    assert page.evaluate("() => location.hash") == ""  # the key left the address bar
    assert page.evaluate("() => document.cookie") == ""
    assert page.evaluate("() => sessionStorage.getItem('xpufleet.session')").startswith("xfu_")
    assert "#login=" not in page.url
    context = new_context(playwright_browser)
    try:
        url = standalone_fleet.login_url()
        first = context.new_page()
        first.goto(url)
        first.locator("[data-xpufleet=drop-zone]").wait_for(timeout=WAIT_MS)
        second = context.new_page()  # a new tab has its own sessionStorage: it must log in, and the key is spent
        second.goto(url)
        second.locator("[data-xpufleet=login] .xf-error", has_text="already used").wait_for(timeout=WAIT_MS)
        plain = context.new_page()
        plain.goto(standalone_fleet.url + "/")
        assert "xpufleet ui" in plain.locator("[data-xpufleet=login]").inner_text(timeout=WAIT_MS)
    finally:
        context.close()


def test_capsule_on_dropped_graphs_and_a_snapshot_change(page_and_log, standalone_fleet, screenshots):
    page, _ = page_and_log
    drop(page, "small.json", model_graph("small.safetensors"))
    small = wait_capsule(page, "c.mPeak === '2'")
    assert small["level"] == "smooth" and "Smooth" in small["text"] and "(sim.)" in small["vram"]
    drop(page, "big.json", model_graph("big.safetensors"))  # another graph: the prediction follows
    big = wait_capsule(page, "c.mPeak === '60'")
    assert big["level"] == "critical" and int(big["p"]) < int(small["p"])
    page.hover("[data-xpufleet=capsule]")
    page.locator("[data-xpufleet=capsule-tooltip]").wait_for(state="visible")
    page.screenshot(path=str(screenshots / "standalone-capsule-tooltip.png"))
    page.mouse.move(600, 700)
    drop(page, "small.json", model_graph("small.safetensors"))
    wait_capsule(page, "c.mPeak === '2'")
    set_simulated_free(standalone_fleet.home, "gpu-box", "cuda:0", 5)
    standalone_fleet.wait_card_free("gpu-box", "cuda:0", 5)
    started = int(bh.capsule(page)["ticks"])
    page.wait_for_function("() => document.querySelector('[data-xpufleet=vram]').dataset.free === '5'", timeout=WAIT_MS)
    assert int(bh.capsule(page)["answerTick"]) <= started + 1
    set_simulated_free(standalone_fleet.home, "gpu-box", "cuda:0", 24)


def test_queue_on_with_a_dropped_graph_and_the_run_in_the_runs_panel(page_and_log, standalone_fleet, screenshots):
    page, _ = page_and_log
    graph = bh.sidecar_harness.iris_graph(epochs=3)
    drop(page, "iris.json", graph)
    page.click("[data-xpufleet=queue-on]")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    dialog.locator("[data-target='worker:gpu-box']").check(timeout=WAIT_MS)
    dialog.locator("[data-device='cuda:0']").check()
    dialog.locator("[data-device='cuda:1']").check()
    assert "cuda:1 → cuda:1 in this run" in dialog.locator("[data-alias='cuda:1']").inner_text()
    assert dialog.locator("[data-device=cpu]").is_disabled()  # a set is of one kind
    dialog.locator("input[type=text]").first.fill("iris from the page")
    dialog.locator("[data-xpufleet=budget][data-source]").wait_for(timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "standalone-queue-on.png"))
    dialog.locator("[data-xpufleet=queue-submit]").click()
    runs = page.locator("[data-xpufleet=runs-panel]")
    runs.locator("[data-xpufleet=detail-status]", has_text="succeeded").wait_for(timeout=WAIT_MS * 2)
    runs.locator("[data-xpufleet=chart][data-drawn=true]").wait_for(timeout=WAIT_MS)
    run_id = runs.locator(".xf-run-row.xf-selected").get_attribute("data-run-id")
    run = standalone_fleet.call("GET", f"/api/runs/{run_id}")
    assert run["graph"] == graph and run["name"] == "iris from the page"
    assert run["worker_id"] == "gpu-box" and run["devices"] == ["cuda:0", "cuda:1"]
    page.screenshot(path=str(screenshots / "standalone-runs-dark.png"))
    page.locator("[data-xpufleet=settings-button]").click()
    settings = page.locator("[data-xpufleet=settings]")
    settings.locator("select").nth(1).select_option("light")
    assert page.evaluate("() => document.documentElement.dataset.theme") == "light"
    settings.locator("button", has_text="Close").click()
    page.screenshot(path=str(screenshots / "standalone-runs-light.png"))
    # the filters: succeeded shows it, failed does not
    runs.locator("[data-status=failed].xf-chip").click()
    runs.locator(".xf-run-list", has_text="No run with this status").wait_for(timeout=WAIT_MS)
    runs.locator("[data-status=failed].xf-chip").click()
    runs.locator(f"[data-run-id='{run_id}']").wait_for(timeout=WAIT_MS)
    page.locator("[data-xpufleet=settings-button]").click()
    page.locator("[data-xpufleet=settings] select").nth(1).select_option("dark")
    page.locator("[data-xpufleet=settings] button", has_text="Close").click()


def test_stop_and_delete_a_run(page_and_log, standalone_fleet):
    page, _ = page_and_log
    rid = standalone_fleet.sidecar.submit(bh.sidecar_harness.iris_graph(epochs=100000), name="long",
                                          target={"worker": "gpu-box"})
    page.click("[data-xpufleet=tab-runs]")
    runs = page.locator("[data-xpufleet=runs-panel]")
    runs.locator(f"[data-run-id='{rid}'] .xf-run-pick").click(timeout=WAIT_MS)
    runs.locator("[data-xpufleet=detail-status]", has_text="running").wait_for(timeout=WAIT_MS)
    runs.locator(f"[data-run-id='{rid}'] progress").wait_for(timeout=WAIT_MS)  # live progress in the list
    runs.locator("[data-xpufleet=stop]").click()
    runs.locator("[data-xpufleet=detail-status]", has_text="cancelled").wait_for(timeout=WAIT_MS)
    assert standalone_fleet.call("GET", f"/api/runs/{rid}")["status"] == "cancelled"
    runs.locator("[data-xpufleet=delete]").click()
    runs.locator("[data-xpufleet=run-detail]", has_text="deleted").wait_for(timeout=WAIT_MS)
    runs.locator(f"[data-run-id='{rid}']").wait_for(state="detached", timeout=WAIT_MS)


def test_runs_panel_shows_waiting_reasons_budget_sources_and_warnings(page_and_log, standalone_fleet):
    page, _ = page_and_log
    harness = bh.sidecar_harness
    standalone_fleet.call("POST", "/api/workers/gpu-box/drain", {})
    try:
        waiting = standalone_fleet.sidecar.submit(harness.iris_graph(1), name="waits", target={
            "worker": "gpu-box", "memory_gib": 2, "memory_source": "estimate"})
        page.click("[data-xpufleet=tab-runs]")
        row = page.locator(f"[data-xpufleet=runs-panel] [data-run-id='{waiting}']")
        assert "draining" in row.locator("[data-xpufleet=waiting]").inner_text(timeout=WAIT_MS)
        assert row.locator("[data-xpufleet=budget-col]").inner_text() == "2.0 GiB (est.) · estimate"
    finally:
        standalone_fleet.call("POST", "/api/workers/gpu-box/undrain", {})
    row.locator("[data-xpufleet=waiting]").wait_for(state="detached", timeout=WAIT_MS)  # it runs now
    # a node set to a card this server lacks: the run warns device_fallback, and the panel shows it
    graph = harness.iris_graph(1)
    graph["7"]["inputs"]["device"] = "cuda:0"
    fallback = standalone_fleet.sidecar.submit(graph, name="falls back", target={"worker": "local"})
    warning = page.locator(f"[data-xpufleet=runs-panel] [data-run-id='{fallback}'] [data-kind=device_fallback]")
    assert "is set to device cuda:0" in warning.inner_text(timeout=WAIT_MS)
    assert standalone_fleet.sidecar.finish(waiting)["status"] == "succeeded"
    assert standalone_fleet.sidecar.finish(fallback)["status"] == "succeeded"


def test_a_server_rejection_shows_in_the_dialog(playwright_browser, standalone_fleet):
    """On a page of its own: the rejection is a 400, which the browser logs as a failed request. The
    dialog lets a budget be typed for this server's own device; the server refuses it (memory admission is
    off for its cards), and the dialog shows the server's own words, whatever they are."""
    context = new_context(playwright_browser)
    try:
        page = context.new_page()
        page.goto(standalone_fleet.login_url())
        drop(page, "iris.json", bh.sidecar_harness.iris_graph(1))
        page.click("[data-xpufleet=queue-on]")
        dialog = page.locator("[data-xpufleet=queue-dialog]")
        dialog.locator("[data-target=local]").check(timeout=WAIT_MS)
        dialog.get_by_label("GiB per card").fill("2")
        before = standalone_fleet.call("GET", "/api/runs")["total"]
        with page.expect_request(lambda r: r.url.endswith("/api/runs") and r.method == "POST") as sent:
            dialog.locator("[data-xpufleet=queue-submit]").click()
        body = json.loads(sent.value.post_data)
        assert body["options"]["target"] == {"worker": "local", "memory_gib": 2}
        with pytest.raises(ApiError) as refused:  # the same body, straight to the server
            standalone_fleet.call("POST", "/api/runs", body)
        assert refused.value.status == 400
        words = refused.value.message
        assert words.startswith("options.target.memory_gib on a run this server may run on its own ")
        error = dialog.locator("[data-xpufleet=queue-error]")
        error.filter(has_text=words).wait_for(timeout=WAIT_MS)
        assert error.inner_text().strip() == words
        assert dialog.is_visible() and dialog.locator("[data-xpufleet=queue-submit]").is_enabled()
        assert standalone_fleet.call("GET", "/api/runs")["total"] == before  # nothing was queued
    finally:
        context.close()


def test_workers_panel_drain_remove_with_confirmation_and_add_worker(page_and_log, standalone_fleet, screenshots):
    page, _ = page_and_log
    spare = standalone_fleet.add_agent("spare-box", "cuda:0=8")
    page.click("[data-xpufleet=tab-workers]")
    panel = page.locator("[data-xpufleet=workers-panel]")
    for name in ("gpu-box", "spare-box"):
        panel.locator(f"[data-worker='{name}']").wait_for(timeout=WAIT_MS)
    card = panel.locator("[data-worker=gpu-box]")
    assert card.locator("[data-xpufleet=simulated]").inner_text() == "SIMULATED cards"
    # shared by memory: the card's mode persists on the server, and a memory bar appears
    card.locator("[data-xpufleet=mode][data-device='cuda:0']").click()
    card.locator("[data-xpufleet=membar]").wait_for(timeout=WAIT_MS)
    assert standalone_fleet.call("GET", "/api/workers/gpu-box")["devices"][1]["mode"] == "shared"
    page.screenshot(path=str(screenshots / "standalone-workers.png"))
    card.locator("[data-xpufleet=mode][data-device='cuda:0']").click()
    card.locator("[data-xpufleet=membar]").wait_for(state="detached", timeout=WAIT_MS)
    # drain greys it out in Queue on...
    card.locator("[data-xpufleet=drain]").click()
    card.locator("[data-xpufleet=worker-status]", has_text="Draining").wait_for(timeout=WAIT_MS)
    page.click("[data-xpufleet=queue-on]")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    assert dialog.locator("[data-target='worker:gpu-box']").is_disabled(timeout=WAIT_MS)
    assert dialog.locator("[data-target='worker:spare-box']").is_enabled()
    page.keyboard.press("Escape")
    card.locator("[data-xpufleet=undrain]").click()
    card.locator("[data-xpufleet=worker-status]", has_text="Online").wait_for(timeout=WAIT_MS)
    # remove: the first click says what the second will do
    spare_card = panel.locator("[data-worker=spare-box]")
    spare_card.locator("[data-xpufleet=remove]").click()
    armed = spare_card.locator("[data-xpufleet=remove][data-armed=true]")
    confirm = standalone_fleet.call("GET", "/api/workers/spare-box")["confirm"]["remove"]  # the server's words
    assert armed.inner_text(timeout=WAIT_MS) == f"Click again: {confirm}"
    assert confirm.startswith("Remove spare-box: revoke its credential and disconnect it")
    page.screenshot(path=str(screenshots / "standalone-workers-remove-confirm.png"))
    assert {w["name"] for w in standalone_fleet.call("GET", "/api/workers")["workers"]} >= {"spare-box"}
    armed.click()
    spare_card.wait_for(state="detached", timeout=WAIT_MS)
    spare.proc.wait(timeout=bh.WAIT_S)  # the removed agent stops
    assert "spare-box" not in {w["name"] for w in standalone_fleet.call("GET", "/api/workers")["workers"]}
    # add worker: the same-machine command, and a join command for another machine
    page.click("[data-xpufleet=add-worker-button]")
    # this server listens on 127.0.0.1 only: "Add worker" opens on "via SSH" (the server says so)
    page.locator("[data-xpufleet=add-ssh] [data-xpufleet=ssh-form]").wait_for(timeout=WAIT_MS)
    page.click("[data-xpufleet=add-tab-join]")
    page.click("[data-xpufleet=make-join]")
    command = page.locator("[data-xpufleet=join-command]").input_value(timeout=WAIT_MS)
    assert command.startswith(f"xpufleet agent start --server {standalone_fleet.url} --join xfj_")
    assert "127.0.0.1 only" in page.locator("[data-xpufleet=add-worker]").inner_text()
    page.screenshot(path=str(screenshots / "standalone-add-worker.png"))


MEASURED = {"source": "measured", "budget_gib": 1.5, "total_gib": 1.5, "rough": False, "reasons": [],
            "from_run": "abcdef0123456789", "n_cards": 1, "items": [
                {"name": "measured_peak", "gib": 1.25, "label": "peak of run abcdef01 on 1 card"},
                {"name": "headroom", "gib": 0.25, "label": "+20%"}]}


@pytest.mark.parametrize(("faked", "typed", "expected_source"), [
    (None, None, "estimate"),  # the server's unchanged estimate goes as one
    (None, "5", "user"),  # a typed figure is the user's
    (MEASURED, None, None),  # an unchanged measured figure is the server's own default: not sent
])
def test_the_budget_field_from_the_estimate_answer(playwright_browser, standalone_fleet, faked, typed, expected_source):
    """The dialog asks the real POST /api/estimates and shows what it answers. The measured case alone is
    answered in the browser: the server answers "measured" only after a run's CUDA peak, and this machine's
    simulated cards report tensor bytes, which are never a measured peak (server/run/memory.py). The run
    itself is a real one on the real sidecar in every case."""
    context = new_context(playwright_browser)
    asked = []

    def estimates(route):
        asked.append(json.loads(route.request.post_data))
        route.fulfill(status=200, content_type="application/json", body=json.dumps(faked))

    if faked is not None:
        context.route("**/api/estimates", estimates)
    else:
        context.on("request", lambda r: asked.append(json.loads(r.post_data))
                   if r.method == "POST" and r.url.endswith("/api/estimates") else None)
    try:
        page = context.new_page()
        page.goto(standalone_fleet.login_url())
        graph = bh.sidecar_harness.iris_graph(1)
        drop(page, "iris.json", graph)
        page.click("[data-xpufleet=queue-on]")
        dialog = page.locator("[data-xpufleet=queue-dialog]")
        dialog.locator("[data-target='worker:gpu-box']").check(timeout=WAIT_MS)
        box = dialog.locator("[data-xpufleet=budget][data-source]")
        box.wait_for(timeout=WAIT_MS)
        assert asked[-1]["graph"] == graph and asked[-1]["options"]["target"]["worker"] == "gpu-box"
        # what the server answers to the dialog's own question
        answer = faked or standalone_fleet.call("POST", "/api/estimates", asked[-1])
        assert box.get_attribute("data-source") == answer["source"]
        assert answer["source"] in ("estimate", "measured") and answer["budget_gib"], answer  # the iris MLP's estimate
        field = dialog.get_by_label("GiB per card")
        assert field.input_value() == str(answer["budget_gib"])
        for item in answer["items"]:
            assert (item.get("label") or item["name"]) in box.inner_text()
        assert ("Estimate (est.)" if answer["source"] == "estimate" else "Measured: the peak of run abcdef01") in box.inner_text()
        if typed is not None:
            field.fill(typed)
        dialog.locator("[data-xpufleet=queue-submit]").click()
        dialog.wait_for(state="detached", timeout=WAIT_MS)
        row = page.locator("[data-xpufleet=runs-panel] .xf-run-row.xf-selected")
        row.wait_for(timeout=WAIT_MS)
        run = standalone_fleet.sidecar.finish(row.get_attribute("data-run-id"))
        budget = {"estimate": answer["budget_gib"], "user": float(typed or 0), None: None}[expected_source]
        assert (run["budget_gib"], run["budget_source"]) == (budget, expected_source)
        if expected_source == "estimate":
            page.locator(f"[data-run-id='{run['id']}'] [data-xpufleet=budget-col]", has_text="(est.)").wait_for(timeout=WAIT_MS)
    finally:
        context.close()


UNNAMED_JS = """() => [...document.querySelectorAll('.xf-root button, .xf-root input, .xf-root select')]
    .filter((el) => el.offsetParent !== null)
    .filter((el) => !(el.getAttribute('aria-label') || el.innerText.trim() || (el.labels && el.labels.length)
                      || el.getAttribute('title')))
    .map((el) => el.outerHTML.slice(0, 120))"""


def test_chinese_texts_keyboard_tabs_and_labelled_controls(page_and_log):
    page, _ = page_and_log
    drop(page, "small.json", model_graph("small.safetensors"))
    wait_capsule(page, "c.mPeak === '2'")
    page.locator("[data-xpufleet=settings-button]").click()
    page.locator("[data-xpufleet=settings] select").first.select_option("zh")
    try:
        page.locator("[data-xpufleet=queue-on]", has_text="排入队列…").wait_for(timeout=WAIT_MS)
        page.locator("[data-xpufleet=settings]", has_text="设置").wait_for(timeout=WAIT_MS)  # open again, relabelled
        page.keyboard.press("Escape")
        wait_capsule(page, "document.querySelector('[data-xpufleet=capsule]').innerText.includes('轻松')")
        assert "small.json" in page.locator("[data-xpufleet=drop-status]").inner_text()  # the graph stayed
        assert page.evaluate("() => document.documentElement.lang") == "zh"
        # the panels' tabs follow the arrow keys
        page.focus("[data-xpufleet=tab-runs]")
        page.keyboard.press("ArrowRight")
        assert page.evaluate("() => document.activeElement.dataset.xpufleet") == "tab-workers"
        page.locator("[data-xpufleet=workers-panel] h2", has_text="Workers").wait_for(timeout=WAIT_MS)
        assert page.locator("[data-xpufleet=add-worker-button]").inner_text() == "新增 worker"
        assert page.evaluate(UNNAMED_JS) == []
        page.keyboard.press("ArrowLeft")
        page.locator("[data-xpufleet=runs-panel]").wait_for(timeout=WAIT_MS)
        assert page.evaluate(UNNAMED_JS) == []
    finally:
        page.locator("[data-xpufleet=settings-button]").click()
        page.locator("[data-xpufleet=settings] select").first.select_option("en")
        page.keyboard.press("Escape")
    page.locator("[data-xpufleet=queue-on]", has_text="Queue on…").wait_for(timeout=WAIT_MS)


def test_no_console_error_on_the_standalone_page(page_and_log, standalone_fleet):
    _, log = page_and_log
    assert log.beyond(bh.ConsoleLog()) == []
