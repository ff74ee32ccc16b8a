"""Remote workers on the standalone page (issue 16 in the front end): the Workers panel's "Add worker"
via SSH (opened on the tab the server names), an SSH worker's connection state as the server reports it,
Disable / Enable with the server's second-click confirmation; one-shot pools in Queue on... A real
sidecar with an agent simulating CUDA cards, a real ssh client against a closed loopback port; Chromium."""

from __future__ import annotations

import json
import socket

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

from xpufleet.server.cli.client import ApiError

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
    context = bh.standalone_context(playwright_browser, SETTINGS)
    page = context.new_page()
    log = bh.ConsoleLog().attach(page)
    page.goto(standalone_fleet.login_url())
    page.locator("[data-xpufleet=drop-zone]").wait_for(timeout=WAIT_MS)
    try:
        yield page, log
    finally:
        context.close()


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
