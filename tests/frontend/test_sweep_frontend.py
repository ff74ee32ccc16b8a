"""The sweep front end on the standalone page (docs/sweeps.md, docs/workers.md "Sweep 與 study", issue 20 point 6): the
New sweep dialog (opened on the optimizer's lr with a range the server accepts, no failed request before
the user types, the picker grouped by node title, the savers moved to each variant's run folder, the
server's dry-run count, the target picker of Queue on...), the Sweeps view (the ranked table live through
the long poll, each child's status, objective and progress, the scatter plot drawn by uPlot on a log axis
with its linear/log toggle) and Cancel. A real sidecar and an agent simulating CUDA cards; Chromium."""

from __future__ import annotations

import json

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Language": "en", "XPUFleet.Capsule.RefreshSeconds": 5}
LRS = ["0.003", "0.03", "0.3"]
TITLES = {"1": "Dataset (iris)", "2": "Train loader", "3": "Val loader", "5": "Optimizer", "7": "train"}


def iris(epochs: int) -> dict:
    """The harness's iris graph with canvas titles and a ModelSaver writing to the shared outputs folder."""
    graph = bh.sidecar_harness.iris_graph(epochs=epochs)
    for node, title in TITLES.items():
        graph[node]["_meta"] = {"title": title}
    graph["9"] = {"class_type": "XPUModelSaver", "_meta": {"title": "Save model"},
                  "inputs": {"model": ["7", 0], "filename": "models/iris.safetensors", "format": "safetensors",
                             "location": "outputs"}}
    return graph


@pytest.fixture(scope="module")
def console():
    return bh.ConsoleLog()


@pytest.fixture(scope="module")
def page(playwright_browser, standalone_fleet, console):
    context = playwright_browser.new_context(viewport={"width": 1400, "height": 1000}, color_scheme="dark")
    context.add_init_script(f"""for (const [k, v] of Object.entries({json.dumps(SETTINGS)}))
        if (localStorage.getItem(k) === null) localStorage.setItem(k, JSON.stringify(v));""")
    page = context.new_page()
    console.attach(page)
    page.goto(standalone_fleet.login_url())
    page.locator("[data-xpufleet=drop-zone]").wait_for(timeout=WAIT_MS)
    try:
        yield page
    finally:
        context.close()


def drop(page, name: str, graph: dict) -> None:
    transfer = page.evaluate_handle("""([name, text]) => { const dt = new DataTransfer();
        dt.items.add(new File([text], name, {type: 'application/json'})); return dt; }""", [name, json.dumps(graph)])
    page.dispatch_event("[data-xpufleet=drop-zone]", "drop", {"dataTransfer": transfer})
    page.locator("[data-xpufleet=graph-loaded]", has_text=name).wait_for(timeout=WAIT_MS)


def open_new_sweep(page):
    """From the page's Sweeps tab (its one navigation: docs/i18n.md) to the Sweeps view, then New sweep."""
    page.click("[data-xpufleet=tab-runs]")
    page.click("[data-xpufleet=tab-sweeps]")
    panel = page.locator("[data-xpufleet=sweeps-panel]")
    panel.wait_for(timeout=WAIT_MS)
    assert page.locator("[data-xpufleet=tab-sweeps]").get_attribute("aria-selected") == "true"
    panel.locator("[data-xpufleet=new-sweep]").click()
    dialog = page.locator("[data-xpufleet=sweep-dialog]")
    dialog.locator("[data-xpufleet=sweep-param]").wait_for(timeout=WAIT_MS)
    return panel, dialog


def pick_lr(dialog, values: list[str]) -> None:
    """The Optimizer group's lr in the picker, then a typed list of values."""
    dialog.locator("[data-xpufleet=sweep-param]").select_option("5.lr")
    assert "graph: 0.01" in dialog.locator("[data-xpufleet=sweep-param-row]").inner_text()
    dialog.locator("[data-xpufleet=sweep-kind]").select_option("values")
    dialog.locator("[data-xpufleet=sweep-values]").fill(", ".join(values))


def picker_groups(dialog) -> dict[str, list[str]]:
    return dialog.locator("[data-xpufleet=sweep-param]").evaluate(
        "s => Object.fromEntries([...s.querySelectorAll('optgroup')].map(g => [g.label, [...g.children].map(o => o.textContent)]))")


def test_new_sweep_opens_on_the_optimizers_lr_with_no_refusal_and_a_picker_grouped_by_node(page, standalone_fleet,
                                                                                         console, screenshots):
    drop(page, "iris-titled.json", iris(epochs=2))
    before = len(console.failed), len(console.errors)
    panel, dialog = open_new_sweep(page)
    # opened on the optimizer's learning rate, a log range a decade each side of the graph's 0.01
    param = dialog.locator("[data-xpufleet=sweep-param]")
    assert param.input_value() == "5.lr"
    assert dialog.locator("[data-xpufleet=sweep-kind]").input_value() == "log"
    assert [dialog.locator(f"[data-xpufleet=sweep-{k}]").input_value() for k in ("low", "high", "steps")] == \
        ["0.001", "0.1", "3"]
    preview = dialog.locator("[data-xpufleet=sweep-preview][data-state=ok][data-count='3']")
    preview.wait_for(timeout=WAIT_MS)
    text = dialog.locator("[data-xpufleet=sweep-preview]").inner_text()
    assert "Optimizer lr=0.001" in text and "Optimizer lr=0.1" in text, text
    # the graph's ModelSaver names a path in the shared outputs folder: the dialog says where files go
    note = dialog.locator("[data-xpufleet=sweep-own-outputs]")
    assert "own run folder" in note.inner_text() and "Save model: models/iris.safetensors" in note.inner_text()
    # the picker: one group per node, by its title; each input by name
    groups = picker_groups(dialog)
    assert {"lr", "weight_decay", "momentum", "name"} <= set(groups["Optimizer"]), groups
    assert "Train loader" in groups and "Val loader" in groups and "Save model" in groups
    assert not any("(" in o for opts in groups.values() for o in opts)  # no "path(class_type)"
    page.screenshot(path=str(screenshots / "standalone-new-sweep-default.png"))
    # a user's own pick: the values of another input are prefilled so the server accepts them as they stand
    param.select_option("2.batch_size")
    assert dialog.locator("[data-xpufleet=sweep-values]").input_value() == "16, 32"
    dialog.locator("[data-xpufleet=sweep-preview][data-state=ok][data-count='2']").wait_for(timeout=WAIT_MS)
    # an emptied field asks nothing of the server (no 400) and says what is missing
    dialog.locator("[data-xpufleet=sweep-values]").fill("")
    dialog.locator("[data-xpufleet=sweep-preview][data-state=incomplete]").wait_for(timeout=WAIT_MS)
    param.select_option("5.lr")
    preview.wait_for(timeout=WAIT_MS)
    assert (len(console.failed), len(console.errors)) == before, (console.failed, console.errors)
    dialog.locator("[data-target='worker:gpu-box']").check()
    dialog.locator("[data-device='cuda:0']").check()
    preview.wait_for(timeout=WAIT_MS)
    dialog.locator("[data-xpufleet=sweep-submit]").click()
    dialog.wait_for(state="detached", timeout=WAIT_MS)
    detail = panel.locator("[data-xpufleet=sweep-detail]")
    detail.locator("[data-xpufleet=sweep-status][data-status=finished]").wait_for(timeout=WAIT_MS * 3)
    sweep_id = panel.locator(".xf-run-row.xf-selected").get_attribute("data-sweep-id")
    server = standalone_fleet.call("GET", f"/api/sweeps/{sweep_id}")
    assert sorted(r["parameters"]["5.lr"] for r in server["table"]) == [0.001, 0.01, 0.1]
    # each variant saved its model in its own run folder: three different files
    saved = set()
    for r in server["table"]:
        arts = standalone_fleet.call("GET", f"/api/runs/{r['run_id']}/artifacts")
        run = standalone_fleet.call("GET", f"/api/runs/{r['run_id']}")
        # a file in the run's own folder is that run's (a worker's run lists it relative to its folder, read
        # through the agent); one outside any run folder keeps its absolute path, the same for every variant
        saved |= {f"{run['run_dir'] or r['run_id']}/{a['path']}" if a["downloadable"] else a["path"]
                  for a in arts["artifacts"] if a["path"].endswith("iris.safetensors")}
    assert len(saved) == 3, saved
    # the plot: 100x in lr, so a log axis by default, its ticks written as the numbers they are
    plot = detail.locator("[data-xpufleet=sweep-plot][data-drawn=true][data-points='3'][data-scale=log]")
    plot.wait_for(timeout=WAIT_MS)
    ticks = plot.get_attribute("data-ticks").split()
    assert {"0.001", "0.01", "0.1"} <= set(ticks), ticks
    assert all(len(t.rstrip("0").split(".")[-1]) <= 6 for t in ticks), ticks
    scale = detail.locator("[data-xpufleet=sweep-plot-scale]")
    assert scale.input_value() == "log"
    # the table and the best line name the parameter as the picker does
    assert "Optimizer lr" in detail.locator("[data-xpufleet=sweep-table] thead").inner_text()
    assert "Optimizer lr=" in detail.locator("[data-xpufleet=sweep-best]").inner_text()
    page.screenshot(path=str(screenshots / "standalone-sweep-log-axis.png"))
    scale.select_option("linear")
    detail.locator("[data-xpufleet=sweep-plot][data-scale=linear][data-drawn=true]").wait_for(timeout=WAIT_MS)
    page.wait_for_function("() => document.querySelector('[data-xpufleet=sweep-plot]').dataset.ticks.includes('0.1')",
                           timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "standalone-sweep-linear-axis.png"))
    assert console.failed[before[0]:] == [] and console.errors[before[1]:] == [], (console.failed, console.errors)


def test_new_sweep_dry_run_submit_and_the_live_ranked_table(page, standalone_fleet, screenshots):
    graph = bh.sidecar_harness.iris_graph(epochs=3)
    drop(page, "iris.json", graph)
    before = standalone_fleet.call("GET", "/api/runs?limit=1000")["total"]
    panel, dialog = open_new_sweep(page)
    pick_lr(dialog, LRS)
    dialog.locator("[data-target='worker:gpu-box']").check()
    dialog.locator("[data-device='cuda:0']").check()
    count = dialog.locator("[data-xpufleet=sweep-preview][data-state=ok][data-count='3']")
    count.wait_for(timeout=WAIT_MS)
    assert "3 runs would be queued" in dialog.locator("[data-xpufleet=sweep-count]").inner_text()
    assert "Optimizer lr=0.3" in dialog.locator("[data-xpufleet=sweep-preview]").inner_text()
    # two seeds per point: the server's count doubles
    dialog.locator("[data-xpufleet=sweep-seeds]").fill("2")
    dialog.locator("[data-xpufleet=sweep-preview][data-state=ok][data-count='6']").wait_for(timeout=WAIT_MS)
    dialog.locator("[data-xpufleet=sweep-seeds]").fill("")
    count.wait_for(timeout=WAIT_MS)
    # a value the node refuses, on this server (which validates the graphs it runs): the server's
    # rejection names the variant, and nothing was queued by the dry runs
    dialog.locator("[data-target=local]").check()
    dialog.locator("[data-xpufleet=sweep-values]").fill("0.01, -3")
    rejected = dialog.locator("[data-xpufleet=sweep-rejected]")
    rejected.wait_for(timeout=WAIT_MS)
    assert "variant 1 (5.lr=-3)" in rejected.inner_text()
    assert standalone_fleet.call("GET", "/api/runs?limit=1000")["total"] == before
    dialog.locator("[data-xpufleet=sweep-values]").fill(", ".join(LRS))
    # the budget field reaches the server too: this server admits by slots and says so
    dialog.locator("[data-xpufleet=sweep-budget]").fill("2")
    dialog.locator("[data-xpufleet=sweep-rejected]", has_text="options.target.memory_gib").wait_for(timeout=WAIT_MS)
    dialog.locator("[data-xpufleet=sweep-budget]").fill("")
    dialog.locator("[data-target='worker:gpu-box']").check()
    dialog.locator("[data-device='cuda:0']").check()
    count.wait_for(timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "standalone-new-sweep.png"))
    dialog.locator("[data-xpufleet=sweep-submit]").click()
    dialog.wait_for(state="detached", timeout=WAIT_MS)
    detail = panel.locator("[data-xpufleet=sweep-detail]")
    table = detail.locator("[data-xpufleet=sweep-table]")
    table.locator("tbody tr").nth(2).wait_for(timeout=WAIT_MS)
    assert table.locator("tbody tr").count() == 3
    detail.locator("[data-xpufleet=sweep-status][data-status=finished]").wait_for(timeout=WAIT_MS * 3)
    sweep_id = panel.locator(".xf-run-row.xf-selected").get_attribute("data-sweep-id")
    server = standalone_fleet.call("GET", f"/api/sweeps/{sweep_id}")
    assert server["n_runs"] == 3 and server["parameters"] == ["5.lr"]
    # the page's table is the server's ranked table: same order, statuses and metrics
    rows = table.locator("tbody tr")
    shown = [(int(rows.nth(i).get_attribute("data-variant")), rows.nth(i).get_attribute("data-status"),
              float(rows.nth(i).get_attribute("data-metric"))) for i in range(3)]
    assert shown == [(r["variant"], r["status"], r["metric"]) for r in server["table"]]
    assert all(r["status"] == "succeeded" and r["metric"] is not None for r in server["table"])
    assert all(r["worker_id"] == "gpu-box" and r["devices"] == ["cuda:0"] for r in server["table"])
    assert sorted(r["parameters"]["5.lr"] for r in server["table"]) == [float(v) for v in LRS]
    assert "gpu-box" in rows.first.inner_text() and "val_accuracy" in table.locator("thead").inner_text()
    assert detail.locator("[data-xpufleet=sweep-best]").inner_text().startswith(f"Best: #{server['best']['variant']}")
    # the plot: uPlot's canvas with one point per variant, lr on a log axis
    plot = detail.locator("[data-xpufleet=sweep-plot][data-drawn=true][data-points='3']")
    plot.wait_for(timeout=WAIT_MS)
    assert plot.locator("canvas").count() >= 1 and plot.get_attribute("data-x") == "5.lr"
    page.screenshot(path=str(screenshots / "standalone-sweep-view.png"))
    # a variant's run opens in the Runs panel
    first_run = server["table"][0]["run_id"]
    table.locator("tbody tr").first.locator("button.xf-link").click()
    page.locator(f"[data-xpufleet=runs-panel] .xf-run-row.xf-selected[data-run-id='{first_run}']").wait_for(timeout=WAIT_MS)


def test_cancel_a_sweep_from_its_view(page, standalone_fleet, screenshots):
    drop(page, "iris-long.json", bh.sidecar_harness.iris_graph(epochs=100000))
    panel, dialog = open_new_sweep(page)
    pick_lr(dialog, ["0.01", "0.02"])
    dialog.locator("[data-target='worker:gpu-box']").check()
    dialog.locator("[data-device='cuda:1']").check()
    dialog.locator("[data-xpufleet=sweep-preview][data-state=ok][data-count='2']").wait_for(timeout=WAIT_MS)
    dialog.locator("[data-xpufleet=sweep-submit]").click()
    detail = panel.locator("[data-xpufleet=sweep-detail]")
    detail.locator("[data-xpufleet=sweep-table] tbody tr[data-status=running]").first.wait_for(timeout=WAIT_MS)
    # a running variant shows its progress (its last progress event: epoch and step of the total)
    progress = detail.locator("[data-xpufleet=sweep-progress]").first
    progress.wait_for(timeout=WAIT_MS)
    first = int(progress.get_attribute("data-value"))
    page.wait_for_function(f"""() => {{ const p = document.querySelector('[data-xpufleet=sweep-progress]');
        return p && Number(p.dataset.value) > {first}; }}""", timeout=WAIT_MS)
    assert "epoch" in progress.inner_text()
    page.screenshot(path=str(screenshots / "standalone-sweep-progress.png"))
    sweep_id = panel.locator(".xf-run-row.xf-selected").get_attribute("data-sweep-id")
    detail.locator("[data-xpufleet=sweep-cancel]").click()
    detail.locator("[data-xpufleet=sweep-status][data-status=cancelled]").wait_for(timeout=WAIT_MS * 2)
    server = standalone_fleet.call("GET", f"/api/sweeps/{sweep_id}")
    assert server["status"] == "cancelled"
    assert {r["status"] for r in server["table"]} <= {"cancelled", "interrupted"}, server["table"]
    for r in server["table"]:
        assert standalone_fleet.call("GET", f"/api/runs/{r['run_id']}")["status"] not in ("queued", "assigned", "running")
    rows = detail.locator("[data-xpufleet=sweep-table] tbody tr")
    assert {rows.nth(i).get_attribute("data-status") for i in range(rows.count())} == {r["status"] for r in server["table"]}
    assert detail.locator("[data-xpufleet=sweep-delete]").is_visible()
    page.screenshot(path=str(screenshots / "standalone-sweep-cancelled.png"))


def test_new_sweep_and_the_sweeps_tab_inside_comfyui(playwright_browser, comfy_host, comfy_fleet, screenshots):
    """The same dialog on ComfyUI's canvas graph (its own graph-to-prompt), through ComfyUI's proxy to the
    sidecar: the menu command, opened on the optimizer's lr with no failed request, the picker by node
    title, the dry-run count, the Sweeps bottom-panel tab until the sweep finished, the axis toggle."""
    with bh.comfy_page(playwright_browser, comfy_host, {"Comfy.TutorialCompleted": True, "XPUFleet.Language": "en"}, height=1000) as (page, log):
        bh.load_api_graph(page, bh.sidecar_harness.iris_graph(epochs=2), "iris-sweep")
        prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
        lr = next(f"{nid}.lr" for nid, n in prompt.items() if n["class_type"] == "XPUOptimizer")
        page.evaluate("() => app.extensionManager.command.execute('XPUFleet.NewSweep')")
        dialog = page.locator("[data-xpufleet=sweep-dialog]")
        dialog.locator("[data-xpufleet=sweep-preview][data-state=ok][data-count='3']").wait_for(timeout=WAIT_MS)
        assert dialog.locator("[data-xpufleet=sweep-param]").input_value() == lr
        title = prompt[lr.split(".")[0]]["_meta"]["title"]
        assert "lr" in picker_groups(dialog)[title]
        dialog.locator("[data-xpufleet=sweep-steps]").fill("2")  # 0.001 and 0.1
        dialog.locator("[data-target='worker:gpu-box']").check()
        dialog.locator("[data-device='cuda:1']").check()
        dialog.locator("[data-xpufleet=sweep-preview][data-state=ok][data-count='2']").wait_for(timeout=WAIT_MS)
        page.screenshot(path=str(screenshots / "comfy-new-sweep.png"))
        dialog.locator("[data-xpufleet=sweep-submit]").click()
        panel = page.locator("[data-xpufleet=sweeps-panel]")
        panel.locator("[data-xpufleet=sweep-status][data-status=finished]").wait_for(timeout=WAIT_MS * 3)
        panel.locator("[data-xpufleet=sweep-plot][data-drawn=true][data-points='2'] canvas").first.wait_for(timeout=WAIT_MS)
        sweep_id = panel.locator(".xf-run-row.xf-selected").get_attribute("data-sweep-id")
        server = comfy_fleet.call("GET", f"/api/sweeps/{sweep_id}")
        assert [r["status"] for r in server["table"]] == ["succeeded", "succeeded"]
        assert all(r["worker_id"] == "gpu-box" and r["devices"] == ["cuda:1"] for r in server["table"])
        run = comfy_fleet.call("GET", f"/api/runs/{server['table'][0]['run_id']}")
        assert run["graph"][lr.split(".")[0]]["inputs"]["lr"] == server["table"][0]["parameters"][lr]
        plot = panel.locator("[data-xpufleet=sweep-plot][data-scale=log]")
        assert {"0.001", "0.01", "0.1"} <= set(plot.get_attribute("data-ticks").split())
        page.screenshot(path=str(screenshots / "comfy-sweep-view.png"))
        panel.locator("[data-xpufleet=sweep-plot-scale]").select_option("linear")
        panel.locator("[data-xpufleet=sweep-plot][data-scale=linear][data-drawn=true]").wait_for(timeout=WAIT_MS)
        assert [f for f in log.failed if "xpufleet" in f] == [], log.failed
        assert [e for e in log.errors if "xpufleet" in e.lower()] == [], log.errors
        # the Runs panel's Sweeps button opens the same tab
        page.evaluate("() => app.extensionManager.command.execute('XPUFleet.ShowRuns')")
        page.locator("[data-xpufleet=runs-panel] [data-xpufleet=open-sweeps]").click(timeout=WAIT_MS)
        panel.wait_for(timeout=WAIT_MS)
