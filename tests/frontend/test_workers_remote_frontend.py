"""Remote workers on the standalone page (issue 16 in the front end): the Workers panel's "Add worker"
via SSH (opened on the tab the server names), an SSH worker's connection state as the server reports it,
Disable / Enable with the server's second-click confirmation; one-shot pools in Queue on... A real
sidecar with an agent simulating CUDA cards, a real ssh client against a closed loopback port; Chromium."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

from xpufleet.common.client import ApiError

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Capsule.RefreshSeconds": 2, "XPUFleet.Language": "en"}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def refusal(fleet, method: str, path: str, body) -> str:
    """The server's own words for a request it refuses (400)."""
    with pytest.raises(ApiError) as refused:
        fleet.call(method, path, body)
    assert refused.value.status == 400, refused.value
    return refused.value.message


@pytest.fixture(scope="module")
def page_and_log(playwright_browser, standalone_fleet):
    with bh.standalone_page(playwright_browser, standalone_fleet, SETTINGS) as page_and_log:
        yield page_and_log


def test_add_an_ssh_worker_then_disable_and_enable_it(page_and_log, standalone_fleet, screenshots):
    page, log = page_and_log
    port = closed_port()
    page.click("[data-xpufleet=tab-workers]")
    panel = page.locator("[data-xpufleet=workers-panel]")
    page.click("[data-xpufleet=add-worker-button]")
    add = page.locator("[data-xpufleet=add-worker]")
    # the sidecar listens on 127.0.0.1 only: the server says "ssh", and the panel opens there with its reason
    add_worker = standalone_fleet.call("GET", "/api/workers")["add_worker"]
    assert add_worker["default"] == "ssh"
    form = add.locator("[data-xpufleet=add-ssh] [data-xpufleet=ssh-form]")
    form.wait_for(timeout=WAIT_MS)
    assert add.locator("[data-xpufleet=add-reason]").inner_text() == add_worker["reason"]
    assert add.locator("[data-xpufleet=add-tab-ssh]").get_attribute("aria-selected") == "true"
    # a key file that is not there: the server's 400, in its own words, and nothing is added
    form.get_by_label("Worker name").fill("far-box")
    form.get_by_label("user@host").fill("fleet@127.0.0.1")
    form.get_by_label("SSH port").fill(str(port))
    form.get_by_label("Identity file (on this server)").fill("/nonexistent/xpufleet-test-key")
    form.get_by_label("Devices").fill("cuda:0")
    with page.expect_request(lambda r: r.url.endswith("/api/workers/ssh") and r.method == "POST") as sent:
        form.locator("[data-xpufleet=ssh-add]").click()
    body = json.loads(sent.value.post_data)
    assert body == {"name": "far-box", "host": "fleet@127.0.0.1", "port": port,
                    "identity": "/nonexistent/xpufleet-test-key", "devices": "cuda:0"}
    words = refusal(standalone_fleet, "POST", "/api/workers/ssh", body)
    assert words == "identity: no key file '/nonexistent/xpufleet-test-key' on this machine (the sidecar's)"
    error = form.locator("[data-xpufleet=ssh-error]")
    error.filter(has_text=words).wait_for(timeout=WAIT_MS)
    assert error.inner_text().strip() == words
    assert "far-box" not in {w["name"] for w in standalone_fleet.call("GET", "/api/workers")["workers"]}
    page.screenshot(path=str(screenshots / "remote-ssh-form-refused.png"))
    # without the key: added; ssh finds the port closed and the panel shows what the server reports
    form.get_by_label("Identity file (on this server)").fill("")
    form.locator("[data-xpufleet=ssh-add]").click()
    card = panel.locator("[data-worker=far-box]")
    state = card.locator("[data-xpufleet=ssh-state][data-state='ssh failed']")
    state.wait_for(timeout=WAIT_MS)
    server = standalone_fleet.call("GET", "/api/workers/far-box")
    assert server["auth"] == "ssh" and server["ssh"]["host"] == "fleet@127.0.0.1" and server["ssh"]["port"] == port
    assert "Connection refused" in state.inner_text() and "Connection refused" in server["ssh"]["detail"]
    assert state.inner_text().startswith(f"fleet@127.0.0.1:{port} — ssh failed: ")
    assert card.locator("[data-xpufleet=worker-status]").inner_text() == "Disconnected"
    progress = form.locator("[data-xpufleet=ssh-progress][data-for=far-box]")
    assert progress.inner_text().startswith(f"far-box: fleet@127.0.0.1:{port} — ")
    assert error.inner_text().strip() == ""
    card.scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "remote-ssh-worker-connecting.png"))
    # Disable: the first click says what the second does (the server's words), the second disables it
    card.locator("[data-xpufleet=disable]").click()
    armed = card.locator("[data-xpufleet=disable][data-armed=true]")
    confirm = standalone_fleet.call("GET", "/api/workers/far-box")["confirm"]["disable"]
    assert confirm.startswith("Disable far-box: end its ssh connection and stop its agent")
    assert armed.inner_text(timeout=WAIT_MS) == f"Click again: {confirm}"
    assert standalone_fleet.call("GET", "/api/workers/far-box")["status"] != "Disabled"  # not yet
    page.screenshot(path=str(screenshots / "remote-ssh-disable-confirm.png"))
    armed.click()
    card.locator("[data-xpufleet=worker-status]", has_text="Disabled").wait_for(timeout=WAIT_MS)
    card.locator("[data-xpufleet=ssh-state][data-state=disabled]").wait_for(timeout=WAIT_MS)
    server = standalone_fleet.call("GET", "/api/workers/far-box")
    assert server["status"] == "Disabled" and server["ssh"]["disabled"] is True and server["selectable"] is False
    assert card.locator("[data-xpufleet=disable]").count() == 0
    page.screenshot(path=str(screenshots / "remote-ssh-disabled.png"))
    # Queue on... lists it, not selectable (the server's `selectable`)
    bh.drop_graph(page, "iris.json", bh.sidecar_harness.iris_graph(1))
    page.click("[data-xpufleet=queue-on]")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    target = dialog.locator("[data-target='worker:far-box']")
    assert target.is_disabled(timeout=WAIT_MS)
    assert "Disabled: cannot be chosen" in dialog.locator("[data-xpufleet=targets]").inner_text()
    page.keyboard.press("Escape")
    dialog.wait_for(state="detached", timeout=WAIT_MS)
    # Enable: connecting again, so no longer Disabled
    card.locator("[data-xpufleet=enable]").click()
    card.locator("[data-xpufleet=worker-status]", has_text="Disconnected").wait_for(timeout=WAIT_MS)
    card.locator("[data-xpufleet=disable]").wait_for(timeout=WAIT_MS)
    server = standalone_fleet.call("GET", "/api/workers/far-box")
    assert server["status"] == "Disconnected" and server["ssh"]["disabled"] is False
    card.locator("[data-xpufleet=ssh-state]:not([data-state=disabled])").wait_for(timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "remote-ssh-enabled.png"))
    # remove (second click): the server's words say it deletes what it stored on the host
    card.locator("[data-xpufleet=remove]").click()
    armed = card.locator("[data-xpufleet=remove][data-armed=true]")
    assert "delete the entry and everything it stored on fleet@127.0.0.1" in armed.inner_text(timeout=WAIT_MS)
    armed.click()
    card.wait_for(state="detached", timeout=WAIT_MS)
    assert "far-box" not in {w["name"] for w in standalone_fleet.call("GET", "/api/workers")["workers"]}
    # the one expected failed request is the refused add (400): no console error beyond it
    assert [f for f in log.failed if "/api/workers/ssh" not in f] == []
    assert [e for e in log.errors if "400" not in e] == []


def one_shot_agent(fleet, label: str, *args: str) -> subprocess.Popen:
    """``xpufleet agent start --foreground --one-shot ARGS`` as a child (the test ends it by its PID)."""
    with open(fleet.home / f"test-agent-{label}.log", "ab") as out:
        return subprocess.Popen([sys.executable, "-m", "xpufleet.server", "agent", "start", "--foreground", "--one-shot",
                                 "--simulate", "cuda:0=8", *args], env=fleet.env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)


def end(agent: subprocess.Popen) -> None:
    if agent.poll() is None:
        agent.kill()
        agent.wait(10)


def submit_from_dialog(page, dialog) -> tuple[dict, str]:
    """Click Queue: the options sent and the new run's id, once the dialog closed (a rejection fails with
    the server's text)."""
    with page.expect_response(lambda r: r.url.endswith("/api/runs") and r.request.method == "POST") as answer:
        dialog.locator("[data-xpufleet=queue-submit]").click()
    page.wait_for_function("""() => { const d = document.querySelector('[data-xpufleet=queue-dialog]');
        return !d || d.querySelector('[data-xpufleet=queue-error]').innerText.trim(); }""", timeout=WAIT_MS)
    assert dialog.count() == 0, dialog.locator("[data-xpufleet=queue-error]").inner_text()
    return json.loads(answer.value.request.post_data)["options"], answer.value.json()["run_id"]


def test_queue_on_a_one_shot_pool_and_a_one_shot_worker(page_and_log, standalone_fleet, screenshots):
    page, log = page_and_log
    created = standalone_fleet.call("POST", "/api/pools", {"name": "burst"})
    token = created["command"].split("--join ")[1].split()[0]
    graph = bh.sidecar_harness.iris_graph(1)
    bh.drop_graph(page, "iris.json", graph)
    page.click("[data-xpufleet=queue-on]")
    dialog = page.locator("[data-xpufleet=queue-dialog]")
    record = dialog.get_by_label("Record node outputs")
    keep, upload = dialog.locator("[data-record=keep]"), dialog.locator("[data-record=upload]")
    # on a worker, true (kept there) is a choice
    dialog.locator("[data-target='worker:gpu-box']").check(timeout=WAIT_MS)
    record.select_option("keep")
    assert keep.is_enabled() and upload.is_enabled()
    # the pool: listed from GET /api/workers's pools with its counts; the server refuses recording there
    pool = dialog.locator("[data-target='pool:burst']")
    label = dialog.locator("[data-xpufleet=targets] [data-status=pool]")
    assert "burst — one-shot pool — 0 idle, 0 busy, 0 queued" in label.inner_text()
    assert "no idle instance: the run waits until one joins" in label.inner_text()
    pool.check()
    assert record.input_value() == ""
    assert keep.is_disabled() and "refused on a one-shot target" in keep.inner_text()
    assert upload.is_disabled() and "refused for a one-shot pool" in upload.inner_text()
    assert "the server refuses recorded outputs for a pool target" in dialog.locator("[data-xpufleet=record-note]").inner_text()
    for mode in (True, "upload"):  # what the dialog tells is the server's rule
        words = refusal(standalone_fleet, "POST", "/api/runs",
                        {"graph": graph, "options": {"record_outputs": mode, "target": {"pool": "burst"}}})
        assert words.startswith("options.record_outputs is off for a one-shot pool (options.target.pool)")
    dialog.locator("[data-xpufleet=budget][data-source]").wait_for(timeout=WAIT_MS)  # the suggestion is in
    dialog.get_by_label("GiB per card").fill("1")  # typed, then cleared: the user's (empty) field
    dialog.get_by_label("GiB per card").fill("")  # no budget: the pool's cards are not known before one joins
    page.screenshot(path=str(screenshots / "remote-queue-on-pool.png"))
    options, run_id = submit_from_dialog(page, dialog)
    assert options["target"] == {"pool": "burst"} and "record_outputs" not in options
    row = page.locator(f"[data-xpufleet=runs-panel] [data-run-id='{run_id}']")
    assert "pool burst" in row.locator("[data-xpufleet=waiting]").inner_text(timeout=WAIT_MS)
    # an instance joins with the pool's credential, takes the run and exits
    agent = one_shot_agent(standalone_fleet, "burst", "--join", token)
    try:
        run = standalone_fleet.sidecar.finish(run_id)
        assert run["status"] == "succeeded" and run["target"] == "pool:burst", run
        assert agent.wait(timeout=bh.WAIT_S) == 0
    finally:
        end(agent)
    row.locator("[data-xpufleet=waiting]").wait_for(state="detached", timeout=WAIT_MS)
    page.screenshot(path=str(screenshots / "remote-pool-run-done.png"))

    # a one-shot worker of this machine: true is refused (the dialog offers upload), upload is kept here
    solo = one_shot_agent(standalone_fleet, "solo", "--name", "solo")
    try:
        standalone_fleet.wait_worker("solo", "Online")
        words = refusal(standalone_fleet, "POST", "/api/runs",
                        {"graph": graph, "options": {"record_outputs": True, "target": {"worker": "solo"}}})
        assert words.startswith("options.record_outputs is off for a one-shot worker")
        page.click("[data-xpufleet=queue-on]")
        dialog.locator("[data-target='worker:gpu-box']").check(timeout=WAIT_MS)
        record.select_option("keep")
        dialog.locator("[data-target='worker:solo']").check()
        assert record.input_value() == "upload"
        assert keep.is_disabled() and upload.is_enabled()
        assert "Choose upload to have them copied to this server" in dialog.locator("[data-xpufleet=record-note]").inner_text()
        dialog.locator("[data-xpufleet=budget][data-source]").wait_for(timeout=WAIT_MS)
        dialog.get_by_label("GiB per card").fill("1")
        dialog.get_by_label("GiB per card").fill("")  # a run without a budget (the card is exclusive)
        page.screenshot(path=str(screenshots / "remote-queue-on-one-shot-worker.png"))
        options, run_id = submit_from_dialog(page, dialog)
        assert options["target"] == {"worker": "solo"} and options["record_outputs"] == "upload"
        run = standalone_fleet.sidecar.finish(run_id)
        assert run["status"] == "succeeded" and run["worker_id"] == "solo", run
        assert solo.wait(timeout=bh.WAIT_S) == 0  # one run, then it exits
    finally:
        end(solo)
    outputs = standalone_fleet.call("GET", f"/api/runs/{run_id}/outputs")  # uploaded: they outlive the worker
    assert outputs["nodes"], outputs
    assert [f for f in log.failed if "/api/workers/ssh" not in f] == []
