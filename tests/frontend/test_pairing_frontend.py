"""Issue 29's first finding in a real Chromium against the real ComfyUI (0.3.64) and a real sidecar with
an agent: a page served from another loopback origin, and a sandboxed iframe in it (``Origin: null``),
cannot queue a run, start a service or read a join token through ComfyUI's /xpufleet/ routes; the plugin's
own page asks to be paired ("Pair this browser": the code `xpufleet pair` prints), keeps the pairing in
localStorage, and then reaches the fleet (server/comfy/guard.py, web/lib/pairing.mjs, docs/security.md)."""

from __future__ import annotations

import contextlib
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import browser_harness as bh  # registered by tests/frontend/conftest.py
import pytest

pytestmark = [pytest.mark.browser, pytest.mark.timeout(900)]

WAIT_MS = int(bh.WAIT_S * 1000)
SETTINGS = {"XPUFleet.Language": "en"}

ATTACK = """<!doctype html><meta charset="utf-8"><title>a page of another origin</title>
<script>
const TARGET = %(target)s, SERVICE = %(service)s, RUN = %(run)s;
async function attack(where) {
  const out = {};
  const simple = (path, body) => fetch(TARGET + path, {method: "POST", mode: "no-cors", body,
    headers: {"Content-Type": "text/plain"}}).then((r) => r.type, (e) => "failed: " + e);
  out.service = await simple("/xpufleet/api/services", SERVICE);
  out.run = await simple("/xpufleet/api/runs", RUN);
  out.start = await simple("/xpufleet/sidecar/start", "{}");
  // with the headers the page sends: a preflight, which ComfyUI does not grant, so nothing is sent or read
  for (const [name, path] of [["token", "/xpufleet/api/workers/join-tokens"], ["run_json", "/xpufleet/api/runs"]]) {
    try {
      const r = await fetch(TARGET + path, {method: "POST", body: path.endsWith("runs") ? RUN : "{}",
        headers: {"Content-Type": "application/json", "X-XPUFleet-Request": "1", "X-XPUFleet-Pairing": "xfp_guess"}});
      out[name] = await r.text();
    } catch (e) { out[name] = "blocked"; }
  }
  try { out.read_runs = await (await fetch(TARGET + "/xpufleet/api/runs")).text(); } catch (e) { out.read_runs = "blocked"; }
  return out;
}
window.results = {};
attack("page").then((r) => { window.results.page = r; });
window.addEventListener("message", (e) => { window.results.iframe = e.data; });
</script>
<iframe sandbox="allow-scripts" srcdoc="%(iframe)s"></iframe>
"""

IFRAME = """<script>
const TARGET = %(target)s, SERVICE = %(service)s;
fetch(TARGET + '/xpufleet/api/services', {method: 'POST', mode: 'no-cors', body: SERVICE,
  headers: {'Content-Type': 'text/plain'}}).then((r) => r.type, (e) => 'failed: ' + e)
  .then((service) => fetch(TARGET + '/xpufleet/api/workers/join-tokens', {method: 'POST', mode: 'no-cors', body: '{}'})
    .then((r) => parent.postMessage({service, token: r.type}, '*'), (e) => parent.postMessage({service, token: String(e)}, '*')));
</script>"""


@contextlib.contextmanager
def other_origin(html: str) -> Iterator[str]:
    """``html`` served at http://127.0.0.2:PORT/ (another loopback address: another origin)."""
    body = html.encode()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), Page)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.2:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_a_page_of_another_origin_and_a_sandboxed_iframe_act_on_nothing(playwright_browser, comfy_host, comfy_fleet,
                                                                         tmp_path: Path):
    marker = tmp_path / "pwned"
    service = json.dumps({"name": "pwn", "program": {"command": ["sh", "-c", f"touch {marker}"]}})
    run = json.dumps({"graph": bh.sidecar_harness.iris_graph(epochs=1), "options": {"name": "from evil"}})
    target = json.dumps(comfy_host.url)
    iframe = IFRAME % {"target": target, "service": json.dumps(service)}
    html = ATTACK % {"target": target, "service": json.dumps(service), "run": json.dumps(run),
                     "iframe": iframe.replace("&", "&amp;").replace('"', "&quot;")}
    responses: list = []
    context = playwright_browser.new_context()
    try:
        # the context's responses: the sandboxed iframe's too
        context.on("response", lambda r: responses.append(r) if "/xpufleet/" in r.url else None)
        page = context.new_page()
        with other_origin(html) as url:
            page.goto(url)
            page.wait_for_function("() => window.results.page && window.results.iframe", timeout=WAIT_MS)
            results = page.evaluate("() => window.results")
            # the Origin each request went with, as sent on the wire (the provisional headers omit it)
            answered = [(r.status, r.url, r.request.header_value("origin")) for r in responses]
    finally:
        context.close()
    # the simple requests reached ComfyUI and were refused there; the preflighted ones never left the browser
    assert results["page"]["token"] == "blocked" and results["page"]["run_json"] == "blocked", results
    assert results["page"]["read_runs"] == "blocked", results  # no CORS: nothing read
    assert results["iframe"] == {"service": "opaque", "token": "opaque"}, results  # sent, answered, unread
    # the page's 3 simple requests and what Playwright sees of the iframe's (Origin: null; Playwright shows
    # a sandboxed frame's network only in part, tests/comfy_host/test_comfy_host_guard.py sends that Origin)
    assert len(answered) >= 3 and all(status == 403 for status, _, _ in answered), answered
    assert any(origin and origin.startswith("http://127.0.0.2:") for _, _, origin in answered), answered
    assert not marker.exists()
    assert comfy_fleet.call("GET", "/api/services")["services"] == []
    assert not [r for r in comfy_fleet.call("GET", "/api/runs")["runs"] if r["name"] == "from evil"]


def test_the_page_asks_to_pair_once_and_then_reaches_the_fleet(playwright_browser, comfy_host, comfy_fleet,
                                                               screenshots):
    bh.comfy_settings(comfy_host, SETTINGS)
    context = playwright_browser.new_context(viewport={"width": 1500, "height": 950})
    try:
        page = bh.open_comfy(context, comfy_host.url)
        status = page.evaluate("""() => import('/scripts/api.js').then(({api}) => {
            window.firstCall = api.fetchApi('/xpufleet/api/workers').then((r) => r.status); })""")
        assert status is None
        dialog = page.locator("[data-xpufleet=pair-dialog]")
        dialog.wait_for(timeout=WAIT_MS)
        assert "xpufleet pair" in dialog.inner_text() and "runtime.json" in dialog.inner_text()
        page.screenshot(path=str(screenshots / "comfy-pair-this-browser.png"))
        page.fill("[data-xpufleet=pair-input]", "xfc_not-a-code")
        page.click("[data-xpufleet=pair-submit]")
        page.locator("[data-xpufleet=pair-error]", has_text="already used or has expired").wait_for(timeout=WAIT_MS)
        page.fill("[data-xpufleet=pair-input]", bh.pairing_code(comfy_host.home))
        page.click("[data-xpufleet=pair-submit]")
        dialog.wait_for(state="detached", timeout=WAIT_MS)
        assert page.evaluate("() => window.firstCall") == 200  # the waiting request, sent again, paired
        secret = page.evaluate(f"() => localStorage.getItem('{bh.PAIRING_STORAGE_KEY}')")
        assert secret.startswith("xfp_")
        names = [p["name"] for p in comfy_fleet.call("GET", "/api/pairings")["pairings"]]
        assert f"ComfyUI at {comfy_host.url.split('//')[1]}" in names
        # a reload keeps it: no dialog, the fleet answers
        page.reload()
        page.wait_for_function(bh.PLUGIN_READY, timeout=WAIT_MS)
        status = page.evaluate("() => import('/scripts/api.js').then(({api}) => api.fetchApi('/xpufleet/api/runs'))"
                               ".then((r) => r.status)")
        assert status == 200 and page.locator("[data-xpufleet=pair-dialog]").count() == 0
    finally:
        context.close()
