"""What the browser tests and bench/bench_frontend.py share: Debian's Chromium driven by Playwright, a
real sidecar with a real agent simulating CUDA cards, a record of the console, and ComfyUI page helpers.

Loaded by path as ``browser_harness`` (tests/frontend/conftest.py, the benchmark); it loads
``sidecar_harness`` (tests/server) and ``comfy_harness`` (tests/comfy_host) the same way.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
CHROMIUM = os.environ.get("XPUFLEET_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run"]
HEARTBEAT_S = "1"  # the agents' heartbeat in these tests: a changed free figure reaches the sidecar fast
WAIT_S = 120.0  # the bound of every wait here (a loaded 2-core machine), never a sleep


def load(name: str, path: Path) -> Any:
    """Import a test helper module by path (test folders are not packages)."""
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


load("graph_parts", TESTS / "graph_parts.py")  # sidecar_harness imports these two
load("processes", TESTS / "processes.py")
sidecar_harness = load("sidecar_harness", TESTS / "server" / "sidecar_harness.py")
comfy_harness = load("comfy_harness", TESTS / "comfy_host" / "comfy_harness.py")


def browser_problem() -> str | None:
    """Why no browser test can run here (None when Chromium is there). Playwright is a declared test
    dependency (pyproject's `test` extra): missing, it fails the browser tests instead of skipping them."""
    import playwright.sync_api  # noqa: F401 - an ImportError here is a broken install, not a skip

    if not (shutil.which(CHROMIUM) or Path(CHROMIUM).is_file()):
        return f"no Chromium at {CHROMIUM}: apt-get install -y chromium (Debian's package)"
    return None


def launch(playwright: Any) -> Any:
    return playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)


# --- the sidecar and its agents ---------------------------------------------------------------------


class Fleet:
    """A real sidecar (``xpufleet start --port 0``) for ``home`` and agents with simulated cards."""

    def __init__(self, home: Path, **env: str) -> None:
        self.home = Path(home)
        extra = {"XPUFLEET_HEARTBEAT_INTERVAL_S": HEARTBEAT_S, "OMP_NUM_THREADS": "1", **env}
        self.env = {**os.environ, "XPUFLEET_HOME": str(self.home), **extra}
        for name in ("CUDA_VISIBLE_DEVICES", "XPUFLEET_RUN_QUEUE_MAX_CONCURRENT"):
            self.env.pop(name, None)
        self.sidecar = sidecar_harness.Sidecar(self.home, env=extra)
        self.agents: list[sidecar_harness.AgentProcess] = []

    def start(self) -> Fleet:
        self.sidecar.start()
        return self

    @property
    def url(self) -> str:
        return self.sidecar.url

    def call(self, method: str, path: str, body: Any = None) -> Any:
        return self.sidecar.client.request(method, path, body)

    def add_agent(self, name: str, simulate: str) -> sidecar_harness.AgentProcess:
        agent = sidecar_harness.AgentProcess(self.sidecar, name, None, "--simulate", simulate)
        self.agents.append(agent)
        self.wait_worker(name, "Online")
        return agent

    def wait_worker(self, name: str, status: str, timeout: float = WAIT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            workers = {w["name"]: w for w in self.call("GET", "/api/workers")["workers"]}
            last = workers.get(name)
            if last is not None and last["status"] == status:
                return last
            time.sleep(0.2)  # worker status has no push channel: a bounded poll
        raise AssertionError(f"worker {name} not {status} within {timeout} s: {last}")

    def wait_card_free(self, worker: str, device: str, free_gib: float, timeout: float = WAIT_S) -> None:
        """Until the sidecar's snapshot of the card shows ``free_gib`` (the agent's next heartbeat)."""
        q = urllib.parse.urlencode({"worker": worker, "device": device})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            snap = self.call("GET", f"/api/snapshot?{q}")["snapshot"]
            if abs(snap["vram_free_gb"] - free_gib) < 1e-6:
                return
            time.sleep(0.05)  # heartbeats have no push channel here: a bounded poll
        raise AssertionError(f"{worker}/{device} did not report {free_gib} GiB free within {timeout} s")

    def login_url(self) -> str:
        """What `xpufleet ui` prints (the real command)."""
        proc = subprocess.run([sys.executable, "-m", "xpufleet.server", "ui"], env=self.env, capture_output=True,
                              text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout.strip()

    def has_route(self, method: str, path: str) -> bool:
        doc = self.call("GET", "/api/openapi.json")
        return method.lower() in doc.get("paths", {}).get(path, {})

    def stop(self) -> None:
        for agent in self.agents:
            agent.stop()
        self.sidecar.stop()


# --- the console ------------------------------------------------------------------------------------


@dataclass
class ConsoleLog:
    """Console errors, uncaught page errors and failed responses of one page, host and port removed
    so two servers' logs compare."""

    errors: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def attach(self, page: Any) -> ConsoleLog:
        def on_console(msg: Any) -> None:
            if msg.type == "error":
                where = _path((msg.location or {}).get("url", ""))
                self.errors.append(f"console: {msg.text} @ {where}")

        page.on("console", on_console)
        page.on("pageerror", lambda exc: self.errors.append(f"pageerror: {exc}"))
        page.on("response", lambda r: self.failed.append(f"{r.status} {_path(r.url)}") if r.status >= 400 else None)
        return self

    def beyond(self, baseline: ConsoleLog, allowed: tuple[str, ...] = ()) -> list[str]:
        """What this log has that the baseline has not (``allowed``: substrings of expected ones)."""
        seen = set(baseline.errors)
        return [e for e in self.errors if e not in seen and not any(a in e for a in allowed)]


def _path(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return parts.path + (f"?{parts.query}" if parts.query else "") if parts.scheme else url


# --- the standalone page --------------------------------------------------------------------------


def standalone_context(browser: Any, settings: dict[str, Any], theme: str = "dark") -> Any:
    """A browser context whose localStorage holds ``settings`` (the same ids as inside ComfyUI)."""
    context = browser.new_context(viewport={"width": 1400, "height": 950}, color_scheme=theme)
    context.add_init_script(f"""for (const [k, v] of Object.entries({json.dumps(settings)}))
        if (localStorage.getItem(k) === null) localStorage.setItem(k, JSON.stringify(v));""")
    return context


@contextlib.contextmanager
def standalone_page(browser: Any, fleet: Any, settings: dict[str, Any], theme: str = "dark",
                    log: ConsoleLog | None = None) -> Iterator[tuple[Any, ConsoleLog]]:
    """The standalone page in a fresh context, logged in through a one-time link, its drop zone drawn;
    yields (page, the console record); the context is closed after."""
    context = standalone_context(browser, settings, theme)
    page = context.new_page()
    log = (log or ConsoleLog()).attach(page)
    page.goto(fleet.login_url())
    page.locator("[data-xpufleet=drop-zone]").wait_for(timeout=WAIT_S * 1000)
    try:
        yield page, log
    finally:
        context.close()


def drop_graph(page: Any, name: str, graph: dict[str, Any]) -> None:
    """A real drop event carrying a File, as the browser makes it when a user drops a file."""
    transfer = page.evaluate_handle("""([name, text]) => { const dt = new DataTransfer();
        dt.items.add(new File([text], name, {type: 'application/json'})); return dt; }""", [name, json.dumps(graph)])
    page.dispatch_event("[data-xpufleet=drop-zone]", "drop", {"dataTransfer": transfer})
    page.locator("[data-xpufleet=graph-loaded]", has_text=name).wait_for(timeout=WAIT_S * 1000)


# --- ComfyUI pages ----------------------------------------------------------------------------------

# ComfyUI's top bar is up: its Run button on front end 1.27 (.comfyui-queue-button), its action bar on 1.5x
# (which shows the Run group only once the page has a graph it can run; a bare ComfyUI's first page has not)
APP_READY = ("() => window.app && window.app.graph && "
             "document.querySelector('.comfyui-queue-button, .queue-button-group, .actionbar-container')")
PLUGIN_READY = "() => document.querySelector('[data-xpufleet=capsule]') && document.querySelector('[data-xpufleet=queue-on]')"


# ComfyUI keeps user settings on its server, so one test module's choice would reach the next module's
# page: the capsule's device (a worker card) outlives the module's sidecar, and its predictions then
# answer 503. Each module starts from these unless it names its own.
PLUGIN_SETTING_DEFAULTS = {"XPUFleet.Predict.Device": ""}


def comfy_settings(host: Any, values: dict[str, Any]) -> None:
    """Set ComfyUI user settings one by one (POST /settings/{id}), before the page loads; the plugin's
    settings in PLUGIN_SETTING_DEFAULTS go back to their defaults unless ``values`` names them."""
    for key, value in {**PLUGIN_SETTING_DEFAULTS, **values}.items():
        status, body = host.request("POST", f"/settings/{key}", value)
        assert status == 200, (key, status, body)


def open_comfy(context: Any, url: str, log: ConsoleLog | None = None, plugin: bool = True) -> Any:
    page = context.new_page()
    if log is not None:
        log.attach(page)
    page.goto(url, timeout=WAIT_S * 1000)  # a loaded machine takes more than Playwright's 30 s default
    page.wait_for_function(APP_READY, timeout=WAIT_S * 1000)
    if plugin:
        page.wait_for_function(PLUGIN_READY, timeout=WAIT_S * 1000)
    return page


# --- pairing the page (docs/security.md) -------------------------------------------------------------

PAIRING_STORAGE_KEY = "xpufleet.pairing"  # web/lib/pairing.mjs
_PAIRINGS: dict[str, str] = {}  # ComfyUI's URL -> the pairing its page got, once per test session


def pairing_code(home: Path) -> str:
    """A one-time pairing code, from the real ``xpufleet pair`` (its last line)."""
    env = {**os.environ, "XPUFLEET_HOME": str(home)}
    proc = subprocess.run([sys.executable, "-m", "xpufleet.server", "pair"], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1].strip()


def _pairing_state(host: Any, secret: str | None) -> int:
    """What the proxy answers ``GET /xpufleet/api/pairings`` with this pairing: 200 paired, 401 not,
    503 no sidecar."""
    headers = {"X-XPUFleet-Pairing": secret} if secret else {}
    req = urllib.request.Request(f"{host.url}/xpufleet/api/pairings", headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code


def pair_page(page: Any, home: Path) -> str:
    """Pair a loaded ComfyUI page as a user does: a fleet request asks, the "Pair this browser" dialog
    opens, the code ``xpufleet pair`` printed is pasted; returns what the page keeps in localStorage."""
    page.evaluate("""() => { import('/scripts/api.js').then(({api}) => api.fetchApi('/xpufleet/api/workers')); }""")
    dialog = page.locator("[data-xpufleet=pair-dialog]")
    dialog.wait_for(timeout=WAIT_S * 1000)
    page.fill("[data-xpufleet=pair-input]", pairing_code(home))
    page.click("[data-xpufleet=pair-submit]")
    dialog.wait_for(state="detached", timeout=WAIT_S * 1000)
    secret = page.evaluate(f"() => localStorage.getItem({json.dumps(PAIRING_STORAGE_KEY)})")
    assert secret and secret.startswith("xfp_"), secret
    return secret


def comfy_pairing(browser: Any, host: Any) -> str | None:
    """This session's pairing of ComfyUI's page with the sidecar of ``host.home``: made once through the
    real dialog (pair_page), then reused (localStorage, set before the page loads); made again when the
    sidecar no longer knows it (a fresh state.db). None when no sidecar runs (nothing to pair with)."""
    secret = _PAIRINGS.get(host.url)
    state = _pairing_state(host, secret)
    if state == 200 or state == 503:
        return secret if state == 200 else None
    context = browser.new_context(viewport={"width": 1500, "height": 950})
    try:
        _PAIRINGS[host.url] = pair_page(open_comfy(context, host.url), host.home)
    finally:
        context.close()
    return _PAIRINGS[host.url]


@contextlib.contextmanager
def comfy_page(browser: Any, host: Any, settings: dict[str, Any], height: int = 950, plugin: bool = True,
               paired: bool = True, **context_options: Any) -> Iterator[tuple[Any, ConsoleLog]]:
    """ComfyUI's page (with the plugin unless ``plugin`` is False: a bare ComfyUI's baseline), in a fresh
    context, after ``settings`` (comfy_settings), paired with the fleet unless ``paired`` is False
    (comfy_pairing); yields (page, its console recorded from the first request); the context is closed
    after, also when a test fails."""
    comfy_settings(host, settings)
    secret = comfy_pairing(browser, host) if plugin and paired else None
    context = browser.new_context(viewport={"width": 1500, "height": height}, **context_options)
    if secret:
        context.add_init_script(f"localStorage.setItem({json.dumps(PAIRING_STORAGE_KEY)}, {json.dumps(secret)});")
    try:
        log = ConsoleLog()
        yield open_comfy(context, host.url, log, plugin=plugin), log
    finally:
        context.close()


def run_button(page: Any) -> Any:
    """ComfyUI's own Run button, on front end 1.27 (.comfyui-queue-button) and 1.3x-1.5x (.queue-button-group)."""
    return page.locator(".comfyui-queue-button, .queue-button-group").get_by_role("button", name="Run", exact=True).first


def templates_button(page: Any) -> Any:
    """The side bar's Templates button: .templates-tab-button on 1.27, a button named Templates on 1.5x."""
    return page.locator(".templates-tab-button").or_(page.get_by_role("button", name="Templates", exact=True)).first


def settings_category(page: Any, name: str) -> Any:
    """A category of ComfyUI's settings dialog: a listbox option on 1.27, a button of its side nav on 1.5x."""
    return page.get_by_role("option", name=name).or_(
        page.locator("[role=dialog]").get_by_role("button", name=name, exact=True)).first


def load_api_graph(page: Any, graph: dict[str, Any], name: str) -> None:
    page.evaluate("([g, n]) => app.loadApiJson(g, n)", [graph, name])


def capsule(page: Any) -> dict[str, str]:
    """The success capsule's data attributes and the bar's texts."""
    return page.evaluate("""() => {
        const bar = document.querySelector('[data-xpufleet=capsules]');
        const c = bar.querySelector('[data-xpufleet=capsule]');
        const v = bar.querySelector('[data-xpufleet=vram]');
        return {...c.dataset, text: c.innerText, vram: v.innerText, vramFree: v.dataset.free,
                ticks: bar.dataset.ticks, answerTick: bar.dataset.answerTick, scans: bar.dataset.scans};
    }""")


def widget_point(page: Any, node_title_or_type: str, widget: str) -> tuple[float, float]:
    """The screen point of a node's widget value (ComfyUI's canvas -> client coordinates)."""
    return tuple(page.evaluate("""([which, name]) => {
        const n = app.graph.nodes.find((x) => x.type === which || x.title === which);
        const w = n.widgets.find((x) => x.name === name);
        return app.canvasPosToClientPos([n.pos[0] + n.size[0] * 0.6, n.pos[1] + (w.y ?? w.last_y) + 10]);
    }""", [node_title_or_type, widget]))


def choose_combo(page: Any, node: str, widget: str, value: str) -> None:
    """Pick ``value`` in a combo widget on the canvas the way a user does (click, then the menu entry)."""
    x, y = widget_point(page, node, widget)
    page.mouse.click(x, y)
    page.locator(".litecontextmenu .litemenu-entry", has_text=value).first.click(timeout=WAIT_S * 1000)


def write_json(path: Path, data: Any) -> Path:
    path.write_text(json.dumps(data))
    return path
