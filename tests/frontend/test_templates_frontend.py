"""A new user's first minutes in the real ComfyUI: Templates -> XPU Fleet -> mlp_digits, clicked as a user
clicks, then ComfyUI's own Run button. Checks what the page shows (the cards and their thumbnails, the loaded
graph, the run's success) and that nothing in the flow logs a console error or a failed request.

Then every template, opened the same way, runs with ComfyUI's Run button (predict_saved after mlp_digits,
whose model it loads) and shows its results on its nodes; with a sidecar running, each Run is also a run with
source canvas on it (docs/canvas-runs.md), listed in the Runs panel.

Screenshots: templates-browser.png, templates-loaded.png, templates-run-done.png, templates-run-<name>.png,
templates-canvas-run-in-runs-panel.png (conftest.py prints where)."""

from __future__ import annotations

import json
import time

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

from xpufleet.constants import SAMPLES_DIR
from xpufleet.server.comfy.make_templates import plugin_defs, sample_graphs
from xpufleet.server.comfy.workflow_format import with_defaults

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"Comfy.TutorialCompleted": True, "XPUFleet.Language": "en"}
GRAPHS = sample_graphs(bh.REPO / SAMPLES_DIR)


@pytest.fixture(scope="module")
def fleet_runs(comfy_fleet):
    """The sidecar, started before the page so that the page pairs with it (a page opened before any
    sidecar runs is not paired, and the pairing dialog would cover it once one starts); the canvas runs
    this module's Runs record are deleted at the end, so the other modules (which share ComfyUI's
    XPUFLEET_HOME) find the run list as they left it."""
    before = {r["id"] for r in comfy_fleet.call("GET", "/api/runs?source=canvas&limit=200")["runs"]}
    yield comfy_fleet
    for run in comfy_fleet.call("GET", "/api/runs?source=canvas&limit=200")["runs"]:
        if run["id"] not in before:
            comfy_fleet.call("DELETE", f"/api/runs/{run['id']}")


@pytest.fixture(scope="module")
def page(playwright_browser, comfy_host, fleet_runs):
    with bh.comfy_page(playwright_browser, comfy_host, SETTINGS) as (page, log):
        page.wait_for_timeout(1000)  # the page's own start-up requests settle before the flow is recorded
        yield page, log


def open_xpufleet_templates(page) -> object:
    bh.templates_button(page).click()
    # the browser is a PrimeVue dialog with a listbox of sources on 1.27, a dialog with a button per source on 1.5x
    dialog = page.locator(".p-dialog, [role=dialog]", has_text="XPU Fleet").first
    dialog.get_by_role("option", name="XPU Fleet").or_(dialog.get_by_role("button", name="XPU Fleet", exact=True)) \
        .first.click(timeout=WAIT_MS)
    return dialog


def seeds(page) -> list[list]:
    """[node title, widget, value, its control-after-generate value] of every seed widget on the canvas."""
    return page.evaluate("""() => app.graph.nodes.flatMap((n) => (n.widgets || []).filter((w) => w.name === 'seed')
        .map((w) => [n.title, w.name, w.value, (w.linkedWidgets || [])[0]?.value ?? null]))""")


def node_results(page) -> dict[str, dict]:
    """What our nodes show after a Run: {node title: {text, curves, points}} from the page's DOM."""
    return page.evaluate("""() => Object.fromEntries(app.graph.nodes.filter((n) => n.xpufleetResult).map((n) => {
        const el = n.xpufleetResult.element, lines = [...el.querySelectorAll('polyline')];
        return [n.title, {text: el.querySelector('.xf-node-result-text').innerText, curves: lines.length,
                          points: lines.reduce((k, l) => k + l.points.length, 0), visible: el.checkVisibility()}]; }))""")


def open_template(page, name: str, nodes: int) -> None:
    dialog = open_xpufleet_templates(page)
    dialog.locator(f"[data-testid=template-workflow-{name}]").click(timeout=WAIT_MS)
    dialog.wait_for(state="hidden", timeout=WAIT_MS)
    # the graph's nodes; a template's note (a virtual node, never in the prompt) is not one of them
    page.wait_for_function(f"() => app.graph.nodes.filter((n) => !n.isVirtualNode).length === {nodes}",
                           timeout=WAIT_MS)


def run_and_wait(page, comfy_host) -> dict:
    """Press ComfyUI's Run button; wait for the prompt's execution_success (or error) on the page."""
    page.evaluate("""() => { window.__xfDone = null;
        for (const type of ['execution_success', 'execution_error'])
            app.api.addEventListener(type, (e) => { window.__xfDone = {type, prompt_id: e.detail.prompt_id}; }); }""")
    bh.run_button(page).click()
    page.wait_for_function("() => window.__xfDone", timeout=WAIT_MS * 3)
    done = page.evaluate("() => window.__xfDone")
    assert done["type"] == "execution_success", comfy_host.log_tail()
    return done


def test_templates_xpu_fleet_mlp_digits_loads_the_graph_and_runs(page, comfy_host, screenshots):
    page, log = page
    mark_errors, mark_failed = len(log.errors), len(log.failed)
    dialog = open_xpufleet_templates(page)
    cards = dialog.locator("[data-testid^=template-workflow-]:not([data-testid=template-workflows-content])")
    for name in GRAPHS:  # every example graph is a card, its thumbnail loaded
        card = dialog.locator(f"[data-testid=template-workflow-{name}]")
        card.wait_for(timeout=WAIT_MS)
        card.locator("img").first.wait_for(timeout=WAIT_MS)
    page.wait_for_function("""() => [...document.querySelectorAll('[data-testid^=template-workflow-] img')]
        .every((img) => img.complete && img.naturalWidth > 0)""", timeout=WAIT_MS)
    assert cards.count() == len(GRAPHS)
    page.screenshot(path=str(screenshots / "templates-browser.png"))

    dialog.locator("[data-testid=template-workflow-mlp_digits]").click()
    dialog.wait_for(state="hidden", timeout=WAIT_MS)
    page.wait_for_function("() => app.graph.nodes.length === 10", timeout=WAIT_MS)
    # the front end's own API prompt of the loaded template is the API-format example (defaults filled)
    prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
    assert json.loads(json.dumps(prompt)) == with_defaults(GRAPHS["mlp_digits"], plugin_defs())
    titles = page.evaluate("() => app.graph._groups.map((g) => g.title)")
    assert titles == ["Data", "Model", "Training", "Results"]
    assert page.evaluate("() => app.extensionManager.workflow.activeWorkflow.filename") == "mlp_digits"
    page.screenshot(path=str(screenshots / "templates-loaded.png"))

    before = seeds(page)
    assert [v for _, _, v, control in before if control] == [0, 0, 0]  # Dataset, MLP, train
    assert {control for *_, control in before if control} == {"fixed"}
    page.evaluate("""() => { window.__xfLive = [];
        app.api.addEventListener('xpufleet.metric', (e) => window.__xfLive.push(e.detail)); }""")
    done = run_and_wait(page, comfy_host)
    assert seeds(page) == before  # ComfyUI's Run left every seed as it was
    # the results on the nodes: the loop's and Evaluate's final metrics, the saved path, the loss curve
    shown = node_results(page)
    outputs = comfy_host.get(f"/history/{done['prompt_id']}")[done["prompt_id"]]["outputs"]
    final = outputs["8"]["metrics"][0]
    assert f"val_accuracy {final['final_val_accuracy']:.4f}" in shown["train"]["text"]
    assert f"accuracy {outputs['9']['metrics'][0]['accuracy']:.4f}" in shown["Evaluate (val)"]["text"]
    saved = outputs["10"]["text"][0]
    assert saved.endswith("output/xpufleet/models/mlp_digits.safetensors") and shown["Save model"]["text"] == saved
    assert shown["train"]["curves"] == 2 and shown["train"]["points"] > 10  # batch loss and validation loss
    live = page.evaluate("() => window.__xfLive")
    assert {p["name"] for p in live} >= {"train_loss_batch", "val_loss_step", "val_accuracy"}
    assert {p["node"] for p in live if p["name"] == "train_loss_batch"} == {"8"}  # the TrainingLoop's
    assert {p["prompt_id"] for p in live} == {done["prompt_id"]}
    history = comfy_host.get(f"/history/{done['prompt_id']}")[done["prompt_id"]]
    assert history["status"]["status_str"] == "success"
    assert all(v["visible"] for v in shown.values()), shown
    page.screenshot(path=str(screenshots / "templates-run-done.png"))
    assert log.errors[mark_errors:] == [] and log.failed[mark_failed:] == []
    assert [f for f in log.failed if "xpufleet" in f or "workflow_templates" in f] == []


@pytest.mark.parametrize("name", sorted(set(GRAPHS) - {"mlp_digits"}))
def test_every_other_template_loads_as_the_same_graph(page, name):
    page, log = page
    mark_errors, mark_failed = len(log.errors), len(log.failed)
    open_template(page, name, len(GRAPHS[name]))
    prompt = page.evaluate("async () => (await app.graphToPrompt()).output")
    assert json.loads(json.dumps(prompt)) == with_defaults(GRAPHS[name], plugin_defs())
    assert log.errors[mark_errors:] == [] and log.failed[mark_failed:] == []


def test_a_new_node_of_ours_starts_with_fixed_seeds_and_randomize_can_still_be_picked(page, comfy_host, screenshots):
    page, log = page
    added = page.evaluate("""() => ['XPUDataset', 'XPUTrainingLoop', 'XPUMLP', 'KSampler'].map((type) => {
        const n = LiteGraph.createNode(type); app.graph.add(n);
        const control = n.widgets.find((w) => w.name === 'seed').linkedWidgets[0].value; app.graph.remove(n);
        return [type, control]; })""")
    # ours start fixed; ComfyUI's own KSampler keeps ComfyUI's default
    assert added == [["XPUDataset", "fixed"], ["XPUTrainingLoop", "fixed"], ["XPUMLP", "fixed"], ["KSampler", "randomize"]]
    open_template(page, "mlp_digits", len(GRAPHS["mlp_digits"]))
    bh.choose_combo(page, "Dataset (digits)", "control_after_generate", "randomize")
    before = {title: value for title, _, value, _ in seeds(page)}
    run_and_wait(page, comfy_host)
    after = {title: (value, control) for title, _, value, control in seeds(page)}
    assert after["Dataset (digits)"][1] == "randomize" and after["Dataset (digits)"][0] != before["Dataset (digits)"]
    assert after["MLP"] == (before["MLP"], "fixed") and after["train"] == (before["train"], "fixed")
    page.screenshot(path=str(screenshots / "templates-seed-randomize.png"))


# Graphs that load what another one saves run after it (predict_saved reads the model mlp_digits saves).
RUN_ORDER = sorted(GRAPHS, key=lambda n: (any(v["class_type"] == "XPUModelLoader" for v in GRAPHS[n].values()), n))


def canvas_run(fleet, prompt_id: str) -> dict:
    """The sidecar's canvas run of ComfyUI's prompt once it ended (the plugin posts every 0.5 s)."""
    deadline, found = time.monotonic() + bh.WAIT_S, None
    while time.monotonic() < deadline:
        runs = fleet.call("GET", "/api/runs?source=canvas&limit=200")["runs"]
        found = next((r for r in runs if r["execution_facts"].get("comfy_prompt_id") == prompt_id), None)
        if found is not None and found["status"] != "running":
            return found
        time.sleep(0.1)  # a run list has no push channel: a bounded poll
    raise AssertionError(f"no ended canvas run of prompt {prompt_id}: {found}")


@pytest.mark.parametrize("name", RUN_ORDER)
def test_every_template_runs_from_the_templates_browser_with_results_on_its_nodes_and_a_canvas_run(
        page, comfy_host, comfy_fleet, screenshots, name):
    page, log = page
    mark_errors, mark_failed = len(log.errors), len(log.failed)
    graph = GRAPHS[name]
    # ComfyUI answers a graph an earlier test ran from its cache, without training: empty it first (ComfyUI's
    # own /free; its worker handles it at once, long before the clicks below queue the prompt)
    assert comfy_host.request("POST", "/free", {"free_memory": True})[0] == 200
    open_template(page, name, len(graph))
    done = run_and_wait(page, comfy_host)
    history = comfy_host.get(f"/history/{done['prompt_id']}")[done["prompt_id"]]
    messages = {m[0]: m[1] for m in history["status"]["messages"]}
    assert messages["execution_cached"]["nodes"] == []  # everything ran
    outputs, shown = history["outputs"], node_results(page)
    for nid, node in graph.items():
        title, kind = node["_meta"]["title"], node["class_type"]
        if kind == "XPUTrainingLoop":
            final = outputs[nid]["metrics"][0]
            assert f"val_accuracy {final['final_val_accuracy']:.4f}" in shown[title]["text"]
            assert shown[title]["curves"] == 2 and shown[title]["points"] > 10  # batch loss and validation loss
            if node["inputs"].get("strategy") == "ddp":  # the canvas Run is one process: the node says why
                assert "warning (ddp_not_available)" in shown[title]["text"]
                assert "Queue on... -> a worker, two or more of its cards" in shown[title]["text"]
        elif kind == "XPUEvaluate":
            assert f"accuracy {outputs[nid]['metrics'][0]['accuracy']:.4f}" in shown[title]["text"]
            assert outputs[nid]["metrics"][0]["accuracy"] > 0.9
        elif kind == "XPUModelSaver":
            assert shown[title]["text"] == outputs[nid]["text"][0]
            assert outputs[nid]["text"][0].endswith(node["inputs"]["filename"])
        elif kind == "XPUPredict":
            assert shown[title]["text"] == outputs[nid]["text"][0] and "accuracy vs labels" in shown[title]["text"]
    assert all(v["visible"] for v in shown.values()), shown
    page.screenshot(path=str(screenshots / f"templates-run-{name}.png"))

    # the same Run, recorded on the sidecar: listed by GET /api/runs with source canvas and its series
    run = canvas_run(comfy_fleet, done["prompt_id"])
    assert (run["status"], run["source"], run["error"]) == ("succeeded", "canvas", None)
    # named after the workflow, as its tab reads (the page says it at execution_start: web/lib/canvas_nodes.mjs)
    assert run["name"] == page.evaluate("() => app.extensionManager.workflow.activeWorkflow.filename")
    assert run["name"].startswith(name)
    series = comfy_fleet.call("GET", f"/api/runs/{run['id']}/metrics")["metrics"]
    evaluate = next(nid for nid, n in graph.items() if n["class_type"] == "XPUEvaluate")
    assert run["final_metrics"]["eval_accuracy"] == pytest.approx(outputs[evaluate]["metrics"][0]["accuracy"])
    if any(n["class_type"] == "XPUTrainingLoop" for n in graph.values()):
        assert len(series["train_loss_batch"]) > 10 and len(series["val_accuracy"]) >= 1
    if name == "mlp_digits":  # and in the Runs panel (the plugin's menu command "Show runs" opens its tab)
        page.evaluate("() => app.extensionManager.command.execute('XPUFleet.ShowRuns')")
        row = page.locator(f".xf-run-row[data-run-id='{run['id']}']")
        row.wait_for(timeout=WAIT_MS)
        assert run["name"] in row.inner_text()
        row.click()
        page.locator("[data-xpufleet=runs-panel] [data-xpufleet=chart][data-drawn=true]").wait_for(timeout=WAIT_MS)
        page.screenshot(path=str(screenshots / "templates-canvas-run-in-runs-panel.png"))
        page.evaluate("() => app.extensionManager.command.execute('Workspace.ToggleBottomPanelTab.xpufleet-runs')")
    assert log.errors[mark_errors:] == [] and log.failed[mark_failed:] == []
