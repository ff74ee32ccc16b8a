"""The Workers panel as a user lives in it (issue 20, point 7), on the standalone page and in the real ComfyUI:
this server's own machine listed first with its card and slots; running plus recently finished runs per
worker; a card shared by memory showing its memory rule (not "Slots 0 / 1"), switched by the user's click;
a pool with its waiting run and the server's reason; the SSH form with every `xpufleet workers add-ssh` field
(python, remote dir, mounts...) and the server's own refusal; the "*" after a simulated card explained in
Queue on.... A real sidecar with an agent simulating CUDA cards (tests/frontend/conftest.py); Chromium."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Capsule.RefreshSeconds": 2, "XPUFleet.Language": "en"}
PANEL = "[data-xpufleet=workers-panel]"


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def next_refresh(page) -> None:
    """Until the panel has drawn one more answer of GET /api/workers (it refreshes every 5 s)."""
    seen = page.locator(PANEL).get_attribute("data-refreshes")
    page.wait_for_function(f"() => document.querySelector('{PANEL}').dataset.refreshes !== '{seen}'", timeout=WAIT_MS)


def workers_data(fleet) -> dict:
    return fleet.call("GET", "/api/workers")


@pytest.fixture(scope="module")
def page_and_log(playwright_browser, standalone_fleet):
    with bh.standalone_page(playwright_browser, standalone_fleet, SETTINGS) as (page, log):
        page.click("[data-xpufleet=tab-workers]")
        page.locator(PANEL).wait_for(timeout=WAIT_MS)
        yield page, log


def test_this_server_is_listed_with_its_slots_and_finished_runs_show_per_worker(page_and_log, standalone_fleet,
                                                                                 screenshots):
    page, log = page_and_log
    graph = bh.sidecar_harness.iris_graph(1)
    local = standalone_fleet.sidecar.submit(graph, name="on-this-server", target={"worker": "local"})
    remote = standalone_fleet.sidecar.submit(graph, name="on-gpu-box", target={"worker": "gpu-box", "devices": ["cuda:0"]})
    for rid in (local, remote):
        assert standalone_fleet.sidecar.finish(rid, timeout=bh.WAIT_S)["status"] == "succeeded"
    me = page.locator(f"{PANEL} [data-this-server=true]")
    me.wait_for(timeout=WAIT_MS)
    server = workers_data(standalone_fleet)["this_server"]
    assert me.locator("h3").inner_text() == "This server" and server["name"] == "local"
    assert me.locator("thead th").nth(1).inner_text() == "Memory (now)"  # probed at each answer, not a heartbeat
    assert me.locator("[data-xpufleet=worker-status]").inner_text() == "Online"
    # the finished runs (the panel refreshes every 5 s): this server's and gpu-box's, each under its own row
    recent = me.locator(f"[data-xpufleet=runs-recent] [data-run='{local}']")
    recent.wait_for(timeout=WAIT_MS)
    # its CPU with the slots the server counts (nothing runs now), said as the server's rule on hover
    cpu = next(d for d in server["devices"] if d["name"] == "cpu")
    assert cpu["slots_used"] == 0 and cpu["admission"]["text"] == f"exclusive: {cpu['slot_limit']} runs at a time, 0 now"
    cell = me.locator("tr[data-device=cpu] [data-xpufleet=admission][data-by=slots]")
    assert cell.inner_text() == f"0 / {cpu['slot_limit']}"
    assert cell.get_attribute("title") == cpu["admission"]["text"]
    assert recent.inner_text().startswith("on-this-server (succeeded, took ")
    assert local in [r["id"] for r in workers_data(standalone_fleet)["this_server"]["recent_runs"]]
    box = page.locator(f"{PANEL} [data-worker=gpu-box]")
    box_recent = box.locator(f"[data-xpufleet=runs-recent] [data-run='{remote}']")
    box_recent.wait_for(timeout=WAIT_MS)
    assert box_recent.inner_text().startswith("on-gpu-box (succeeded, took ")
    assert me.locator(f"[data-run='{remote}']").count() == 0 and box.locator(f"[data-run='{local}']").count() == 0
    assert "Runs: none" in box.locator("[data-xpufleet=runs-running]").inner_text()  # none running now
    me.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "workers-this-server-and-recent-runs.png"))
    # a running run: listed under Runs with its status and device, and it holds one of the CPU's slots
    long_run = standalone_fleet.sidecar.submit(bh.sidecar_harness.iris_graph(100000), name="long-local",
                                               target={"worker": "local"})
    try:
        standalone_fleet.sidecar.wait_for(long_run, "run_started", timeout=bh.WAIT_S)
        running = me.locator(f"[data-xpufleet=runs-running] [data-run='{long_run}'][data-run-status=running]")
        running.wait_for(timeout=WAIT_MS)
        assert running.inner_text().startswith("long-local (running, cpu")
        page.wait_for_function(f"() => document.querySelector('{PANEL} [data-this-server=true] tr[data-device=cpu] "
                               f"[data-xpufleet=admission]').innerText === '1 / {cpu['slot_limit']}'", timeout=WAIT_MS)
        page.screenshot(path=str(screenshots / "workers-this-server-running-run.png"))
    finally:
        standalone_fleet.call("POST", f"/api/runs/{long_run}/cancel", {})
    assert standalone_fleet.sidecar.finish(long_run, timeout=bh.WAIT_S)["status"] == "cancelled"
    me.locator(f"[data-xpufleet=runs-recent] [data-run='{long_run}'][data-run-status=cancelled]").wait_for(timeout=WAIT_MS)
    # a click opens the run in the Runs panel
    recent.click()
    page.locator("[data-xpufleet=runs-panel]").wait_for(timeout=WAIT_MS)
    page.click("[data-xpufleet=tab-workers]")
    page.locator(PANEL).wait_for(timeout=WAIT_MS)
    assert log.errors == [] and log.failed == []


def test_a_shared_card_shows_its_memory_rule_instead_of_slots(page_and_log, standalone_fleet, screenshots):
    page, log = page_and_log
    box = page.locator(f"{PANEL} [data-worker=gpu-box]")
    exclusive = box.locator("tr[data-device='cuda:0'] [data-xpufleet=admission]")
    exclusive.wait_for(timeout=WAIT_MS)
    assert exclusive.get_attribute("data-by") == "slots" and exclusive.inner_text() == "0 / 1"
    assert exclusive.get_attribute("title") == "exclusive: 1 run at a time, 0 now"
    toggle = box.locator("[data-xpufleet=mode][data-device='cuda:1']")
    try:
        toggle.click()  # the user shares cuda:1 by memory
        rule = box.locator("tr[data-device='cuda:1'] [data-xpufleet=admission][data-by=memory]")
        rule.wait_for(timeout=WAIT_MS)
        card = next(d for d in next(w for w in workers_data(standalone_fleet)["workers"] if w["name"] == "gpu-box")["devices"]
                    if d["name"] == "cuda:1")
        a = card["admission"]
        assert card["mode"] == "shared" and a["by"] == "memory" and a["runs"] == 0, card
        assert rule.inner_text() == (f"by memory: {a['free_for_budgets_gib']:.1f} GiB free for a new budget · "
                                     f"{a['reserved_gib']:.1f} GiB reserved · 0 run(s) on it")
        assert rule.get_attribute("title") == a["text"] and a["text"].startswith("shared by memory: a run starts")
        assert "Slots" not in rule.inner_text()
        header = box.locator("thead th").nth(2).inner_text()
        assert header == "Slots used / limit, or memory rule"
        box.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshots / "workers-shared-card-rule.png"))
    finally:
        standalone_fleet.call("PUT", "/api/workers/gpu-box/devices/cuda:1/mode", {"mode": "exclusive"})
    box.locator("tr[data-device='cuda:1'] [data-xpufleet=admission][data-by=slots]").wait_for(timeout=WAIT_MS)
    assert log.errors == [] and log.failed == []


def one_shot_agent(fleet, token: str) -> subprocess.Popen:
    """An instance of a pool: ``xpufleet agent start --foreground --one-shot --join TOKEN`` (ended by its PID)."""
    with open(fleet.home / "test-agent-pool-instance.log", "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "xpufleet.server", "agent", "start", "--foreground", "--one-shot",
                                 "--simulate", "cuda:0=8", "--join", token], env=fleet.env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


def test_a_pool_is_listed_with_its_waiting_run_and_then_its_instance(page_and_log, standalone_fleet, screenshots):
    page, log = page_and_log
    token = standalone_fleet.call("POST", "/api/pools", {"name": "burst"})["command"].split("--join ")[1].split()[0]
    rid = standalone_fleet.sidecar.submit(bh.sidecar_harness.iris_graph(100000), name="for-the-pool",
                                          target={"pool": "burst"})
    agent = None
    try:
        pool = page.locator(f"{PANEL} [data-xpufleet=pools] [data-pool=burst]")
        waiting = pool.locator(f"[data-xpufleet=pool-waiting] li[data-run='{rid}']")
        waiting.locator("[data-xpufleet=waiting-reason]").wait_for(timeout=WAIT_MS)
        server = next(p for p in workers_data(standalone_fleet)["pools"] if p["name"] == "burst")
        assert [r["id"] for r in server["waiting"]] == [rid] and server["queued"] == 1
        reason = server["waiting"][0]["waiting_reason"]
        assert reason and "burst" in reason
        next_refresh(page)  # the page and the answer above come from the same state now
        assert waiting.locator("[data-xpufleet=waiting-reason]").inner_text() == reason
        assert waiting.inner_text().startswith("for-the-pool — queued ")
        assert pool.locator("[data-xpufleet=pool-counts]").inner_text() == "0 idle, 0 busy, 1 queued"
        assert pool.locator("[data-xpufleet=pool-instances]").inner_text() == "Instances: none has joined yet"
        assert pool.locator(".xf-tag").inner_text() == "one-shot pool"
        pool.scroll_into_view_if_needed()
        page.screenshot(path=str(screenshots / "workers-pool-waiting-run.png"))
        # an instance joins, takes the run: listed under the pool as running it, no longer waiting
        agent = one_shot_agent(standalone_fleet, token)
        standalone_fleet.sidecar.wait_for(rid, "run_started", timeout=bh.WAIT_S)
        instance = pool.locator("[data-xpufleet=pool-instances] li[data-state=running]")
        instance.locator(f"[data-run='{rid}']").wait_for(timeout=WAIT_MS)
        assert instance.inner_text().endswith("— running its run for-the-pool")
        assert pool.locator(f"[data-xpufleet=pool-waiting] li[data-run='{rid}']").count() == 0
        server = next(p for p in workers_data(standalone_fleet)["pools"] if p["name"] == "burst")
        assert [i["instance_state"] for i in server["instances"]] == ["running"] and server["waiting"] == []
        page.screenshot(path=str(screenshots / "workers-pool-instance-running.png"))
    finally:
        standalone_fleet.call("POST", f"/api/runs/{rid}/cancel", {})
        if agent is not None:
            try:
                agent.wait(timeout=bh.WAIT_S)  # one run, then it exits
            finally:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait(10)
    assert standalone_fleet.sidecar.finish(rid, timeout=bh.WAIT_S)["status"] == "cancelled"
    assert log.errors == [] and log.failed == []


def test_the_ssh_form_has_every_cli_field_and_the_worker_is_added_with_them(page_and_log, standalone_fleet,
                                                                           screenshots):
    page, log = page_and_log
    port = closed_port()
    page.click("[data-xpufleet=add-worker-button]")
    form = page.locator("[data-xpufleet=add-worker] [data-xpufleet=ssh-form]")
    form.wait_for(timeout=WAIT_MS)
    form.get_by_label("Worker name").fill("lab-box")
    form.get_by_label("user@host").fill("fleet@127.0.0.1")
    form.get_by_label("SSH port").fill(str(port))
    form.get_by_label("Python on the host").fill("/opt/py311/bin/python3")
    form.get_by_label("Folder on the host").fill("/srv/xpufleet/lab-box")
    form.get_by_label("Mounts").fill("data=/srv/datasets\nmodels relative")
    form.get_by_label("Devices").fill("cuda:0")
    form.get_by_label("Simulated cards").fill("cuda:0=8")
    # a mount the server refuses: its words under the form, nothing added
    with page.expect_response(lambda r: r.url.endswith("/api/workers/ssh") and r.request.method == "POST") as answer:
        form.locator("[data-xpufleet=ssh-add]").click()
    assert answer.value.status == 400
    words = answer.value.json()["error"]
    assert words == "mounts: 'models relative': write LABEL=/absolute/folder/on/the/host"
    form.locator("[data-xpufleet=ssh-error]").filter(has_text=words).wait_for(timeout=WAIT_MS)
    assert "lab-box" not in {w["name"] for w in workers_data(standalone_fleet)["workers"]}
    page.screenshot(path=str(screenshots / "workers-ssh-form-every-field-refused.png"))
    form.get_by_label("Mounts").fill("data=/srv/datasets\nmodels=~/models")
    with page.expect_request(lambda r: r.url.endswith("/api/workers/ssh") and r.method == "POST") as sent:
        form.locator("[data-xpufleet=ssh-add]").click()
    body = json.loads(sent.value.post_data)
    assert body == {"name": "lab-box", "host": "fleet@127.0.0.1", "port": port, "devices": "cuda:0",
                    "python": "/opt/py311/bin/python3", "remote_dir": "/srv/xpufleet/lab-box",
                    "mounts": ["data=/srv/datasets", "models=~/models"], "simulate": "cuda:0=8"}
    card = page.locator(f"{PANEL} [data-worker=lab-box]")
    setup = card.locator("[data-xpufleet=ssh-setup]")
    setup.wait_for(timeout=WAIT_MS)
    server = standalone_fleet.call("GET", "/api/workers/lab-box")["ssh"]
    assert server["python"] == "/opt/py311/bin/python3" and server["remote_dir"] == "/srv/xpufleet/lab-box"
    assert server["agent_args"] == ["--devices", "cuda:0", "--mount", "data=/srv/datasets", "--mount", "models=~/models",
                                    "--simulate", "cuda:0=8"]
    assert setup.inner_text() == ("/opt/py311/bin/python3 · /srv/xpufleet/lab-box · --devices cuda:0 --mount "
                                  "data=/srv/datasets --mount models=~/models --simulate cuda:0=8")
    assert form.locator("[data-xpufleet=ssh-error]").inner_text().strip() == ""
    card.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "workers-ssh-worker-added-with-every-field.png"))
    card.locator("[data-xpufleet=remove]").click()
    card.locator("[data-xpufleet=remove][data-armed=true]").click()
    card.wait_for(state="detached", timeout=WAIT_MS)
    assert [f for f in log.failed if "/api/workers/ssh" not in f] == []
    assert [e for e in log.errors if "400" not in e] == []


def test_the_star_after_a_simulated_card_is_explained_in_queue_on(page_and_log, screenshots):
    page, log = page_and_log
    mark_errors, mark_failed = len(log.errors), len(log.failed)  # the SSH test's expected 400 is before
    bh.drop_graph(page, "iris.json", bh.sidecar_harness.iris_graph(1))
    page.click("[data-xpufleet=queue-on]")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    targets = dialog.locator("[data-xpufleet=targets]")
    line = targets.locator("[data-status=Online] label").first
    line.wait_for(timeout=WAIT_MS)
    assert "cuda:0*, cuda:1*" in line.inner_text()
    mark = "* a simulated card: no real GPU behind it (tests and demos)"
    assert targets.locator("[data-xpufleet=simulated-mark]").inner_text() == mark
    assert line.get_attribute("title") == mark
    page.screenshot(path=str(screenshots / "workers-queue-on-star-explained.png"))
    page.keyboard.press("Escape")
    dialog.wait_for(state="detached", timeout=WAIT_MS)
    assert log.errors[mark_errors:] == [] and log.failed[mark_failed:] == []


def test_in_comfyui_the_workers_tab_lists_this_server_and_a_finished_run(playwright_browser, comfy_host, comfy_fleet,
                                                                         screenshots):
    with bh.comfy_page(playwright_browser, comfy_host, {"Comfy.TutorialCompleted": True, "XPUFleet.Language": "en"}) as (page, log):
        mark_errors, mark_failed = len(log.errors), len(log.failed)  # ComfyUI's own start-up is not this test's
        rid = comfy_fleet.sidecar.submit(bh.sidecar_harness.iris_graph(1), name="comfy-local", target={"worker": "local"})
        assert comfy_fleet.sidecar.finish(rid, timeout=bh.WAIT_S)["status"] == "succeeded"
        page.evaluate("() => app.extensionManager.command.execute('XPUFleet.ShowWorkers')")
        me = page.locator(f"{PANEL} [data-this-server=true]")
        me.wait_for(timeout=WAIT_MS)
        assert me.locator("h3").inner_text() == "This server"
        me.locator("tr[data-device=cpu] [data-xpufleet=admission][data-by=slots]").wait_for(timeout=WAIT_MS)
        me.locator(f"[data-xpufleet=runs-recent] [data-run='{rid}']").wait_for(timeout=WAIT_MS)
        assert page.locator(f"{PANEL} [data-worker=gpu-box] [data-xpufleet=admission]").count() == 3  # cpu, cuda:0, cuda:1
        page.screenshot(path=str(screenshots / "comfy-workers-this-server.png"))
        assert log.errors[mark_errors:] == [] and log.failed[mark_failed:] == []
        assert [f for f in log.failed if "xpufleet" in f] == []


def test_in_chinese_and_the_light_theme_the_new_parts_are_translated_and_styled(playwright_browser, standalone_fleet,
                                                                              screenshots):
    context = bh.standalone_context(playwright_browser, {**SETTINGS, "XPUFleet.Language": "zh"}, theme="light")
    log = bh.ConsoleLog()
    try:
        page = context.new_page()
        log.attach(page)
        page.goto(standalone_fleet.login_url())
        page.click("[data-xpufleet=tab-workers]")
        me = page.locator(f"{PANEL} [data-this-server=true]")
        me.wait_for(timeout=WAIT_MS)
        assert me.locator("h3").inner_text() == "本服务器"
        assert me.locator("thead th").nth(2).inner_text() == "已用槽位 / 上限，或内存规则"
        page.click("[data-xpufleet=add-worker-button]")
        form = page.locator("[data-xpufleet=ssh-form]")
        mounts = form.get_by_label("挂载")
        mounts.wait_for(timeout=WAIT_MS)
        for label in ("主机上的 Python", "主机上的文件夹", "模拟显卡"):
            assert form.get_by_label(label).count() == 1, label
        # the mounts box looks like the inputs beside it (the theme's colours, not the browser's)
        look = "(el) => { const s = getComputedStyle(el); return [s.backgroundColor, s.color, s.borderTopColor]; }"
        assert mounts.evaluate(look) == form.get_by_label("主机上的 Python").evaluate(look)
        page.screenshot(path=str(screenshots / "workers-zh-light.png"))
        assert log.errors == [] and log.failed == []
    finally:
        context.close()
