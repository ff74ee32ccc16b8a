"""A real ComfyUI for the `comfy`-marked tests: the plugin's dependencies installed into its interpreter,
a fresh base directory with this repository at BASE/custom_nodes/xpufleet, ComfyUI started on a free
loopback port in its own process group and stopped by its PID, and a client that drives it as the front
end does (``POST /prompt`` and the ``/ws`` events, ``/history``, ``/interrupt``).

Which ComfyUI: ``COMFYUI_DIR`` (the folder with main.py) and ``COMFYUI_PYTHON`` (its interpreter);
``bash ../shared/comfyui/setup.sh`` builds one and prints both. Loaded by tests/comfy_host/conftest.py
as ``comfy_harness``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
ENV_DIR, ENV_PYTHON = "COMFYUI_DIR", "COMFYUI_PYTHON"
START_TIMEOUT_S = 180.0  # ComfyUI's start-up takes 10-15 s on a 2-core machine; bounded, not slept
PROMPT_TIMEOUT_S = 300.0
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # terminal colour codes

SKIP_REASON = (f"no ComfyUI configured: set {ENV_DIR} (the folder with main.py) and {ENV_PYTHON} (its interpreter); "
               "`bash ../shared/comfyui/setup.sh` builds one and prints both")


def configured() -> tuple[Path, Path] | None:
    """(COMFYUI_DIR, COMFYUI_PYTHON) when both are set; a set but broken path is an error, not a skip."""
    where, python = os.environ.get(ENV_DIR), os.environ.get(ENV_PYTHON)
    if not where or not python:
        return None
    comfy_dir, py = Path(where).expanduser(), Path(python).expanduser()
    if not (comfy_dir / "main.py").is_file():
        raise RuntimeError(f"{ENV_DIR}={where} has no main.py: point it at a ComfyUI checkout")
    if not os.access(py, os.X_OK):
        raise RuntimeError(f"{ENV_PYTHON}={python} is not an executable interpreter")
    return comfy_dir, py


# --- which ComfyUI pair this session tests (docs/testing.md) -----------------------------------------
# `make test` runs the comfy and browser selections against COMFYUI_DIR/COMFYUI_PYTHON (the first pair:
# 0.3.64 + front end 1.27.10 in CI), then, when COMFYUI2_DIR/COMFYUI2_PYTHON are set, once more against that
# second pair (0.33.0 + 1.58.1) with XPUFLEET_COMFY_PAIR=second: there only the tests that run in a ComfyUI
# (they use one of HOST_FIXTURES), less those marked ``one_pair``.
PAIR_ENV = "XPUFLEET_COMFY_PAIR"
HOST_FIXTURES = frozenset({"comfyui", "comfy_host", "bare_comfy"})


def second_pair() -> bool:
    """True when this session tests the second ComfyUI pair."""
    value = os.environ.get(PAIR_ENV, "").strip()
    if value not in ("", "first", "second"):
        raise RuntimeError(f"{PAIR_ENV}={value!r}: must be 'first' or 'second' (docs/testing.md)")
    return value == "second"


def select_for_pair(config: Any, items: list[Any]) -> None:
    """On the second pair: deselect what does not run in a ComfyUI, and what is marked ``one_pair``."""
    if not second_pair():
        return
    keep, drop = [], []
    for item in items:
        in_host = bool(HOST_FIXTURES & set(getattr(item, "fixturenames", ())))
        (keep if in_host and item.get_closest_marker("one_pair") is None else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def comfy_version(comfy_dir: Path) -> str:
    """The ComfyUI version of a checkout (its comfyui_version.py), or "unknown"."""
    found = re.search(r"""__version__\s*=\s*["']([^"']+)""",
                      (comfy_dir / "comfyui_version.py").read_text() if (comfy_dir / "comfyui_version.py").is_file()
                      else "")
    return found.group(1) if found else "unknown"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- the plugin's dependencies in ComfyUI's interpreter --------------------------------------------

_MISSING = r"""
import importlib.metadata as md, sys
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement
for line in sys.argv[1:]:
    req = Requirement(line)
    try:
        ok = req.specifier.contains(md.version(req.name), prereleases=True)
    except md.PackageNotFoundError:
        ok = False
    if not ok:
        print(line)
"""


def plugin_requirements() -> list[str]:
    """What ComfyUI-Manager installs for the plugin: requirements.txt (not the plugin itself: ComfyUI
    loads it from custom_nodes/)."""
    lines = (REPO / "requirements.txt").read_text(encoding="utf-8").splitlines()
    return [line.split("#")[0].strip() for line in lines if line.split("#")[0].strip()]


def install_plugin_deps(python: Path, work: Path) -> list[str]:
    """pip-install what ComfyUI's interpreter lacks of the plugin's dependencies; return what it installed.

    torch is pinned to the build already there, so pip never swaps ComfyUI's torch for another one.
    """
    reqs = plugin_requirements()
    missing = subprocess.run([str(python), "-c", _MISSING, *reqs], capture_output=True, text=True, check=True,
                             timeout=120).stdout.split("\n")
    missing = [m for m in missing if m.strip()]
    if not missing:
        return []
    torch_version = subprocess.run([str(python), "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True, timeout=120).stdout.strip()
    constraints = work / "constraints.txt"
    constraints.write_text(f"torch=={torch_version}\n" if torch_version else "")
    proc = subprocess.run([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                           "-c", str(constraints), *missing], capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(f"installing {missing} into {python} failed:\n{proc.stderr[-3000:]}")
    return missing


# --- the ComfyUI process -----------------------------------------------------------------------------


@dataclass
class PromptResult:
    """One finished prompt: its id, the ``/history`` entry, and the ws events it sent."""

    prompt_id: str
    history: dict[str, Any]
    events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def outputs(self) -> dict[str, Any]:
        return self.history.get("outputs", {})

    @property
    def messages(self) -> dict[str, dict[str, Any]]:
        """Status messages by type (execution_start, execution_cached, execution_success|error|interrupted)."""
        return {m[0]: m[1] for m in self.history.get("status", {}).get("messages", [])}

    @property
    def succeeded(self) -> bool:
        return "execution_success" in self.messages

    def metrics(self, node: str) -> dict[str, Any]:
        return self.outputs[node]["metrics"][0]


class ComfyUI:
    """One ComfyUI process over ``base`` (its own custom_nodes/, output/, models/, user/)."""

    def __init__(self, comfy_dir: Path, python: Path, base: Path, home: Path) -> None:
        self.comfy_dir, self.python, self.base, self.home = comfy_dir, python, base, home
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self.log_path = base / "comfyui.log"
        self.startup_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def prepare(self) -> None:
        (self.base / "custom_nodes").mkdir(parents=True, exist_ok=True)
        link = self.base / "custom_nodes" / "xpufleet"
        if not link.exists():
            link.symlink_to(REPO, target_is_directory=True)
        self.home.mkdir(parents=True, exist_ok=True)

    def start(self) -> ComfyUI:
        self.prepare()
        self.port = free_port()
        env = {**os.environ, "XPUFLEET_HOME": str(self.home), "PYTHONUNBUFFERED": "1"}
        for name in ("PYTHONPATH", "VIRTUAL_ENV", "CUDA_VISIBLE_DEVICES"):
            env.pop(name, None)
        cmd = [str(self.python), str(self.comfy_dir / "main.py"), "--cpu", "--listen", "127.0.0.1",
               "--port", str(self.port), "--disable-auto-launch", "--base-directory", str(self.base),
               # no database file in the ComfyUI checkout (it may be shared or read-only)
               "--database-url", "sqlite:///:memory:"]
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(self.base), env=env,
                                         start_new_session=True)
        deadline = t0 + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ComfyUI exited with {self.proc.returncode} during start-up:\n{self.log_tail()}")
            with contextlib.suppress(OSError, urllib.error.URLError):
                with urllib.request.urlopen(f"{self.url}/system_stats", timeout=2) as resp:
                    if resp.status == 200:
                        self.startup_s = time.monotonic() - t0
                        return self
            time.sleep(0.2)  # a bounded poll of the readiness endpoint
        self.stop()
        raise RuntimeError(f"ComfyUI did not answer /system_stats within {START_TIMEOUT_S:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM by PID, then SIGKILL by PID after 20 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(20)

    def log(self) -> str:
        """ComfyUI's output so far, without the colour codes 0.33 puts around each line's ``[LEVEL]``."""
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return _ANSI.sub("", text)

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-n:])

    # -- HTTP --

    pairing: str | None = None  # this client's pairing with the sidecar (pair()), sent to /xpufleet/ routes

    def request(self, method: str, path: str, body: Any = None, timeout: float = 60.0, paired: bool = True
                ) -> tuple[int, Any]:
        """(status, JSON or text) of one request; HTTP errors are answers, not exceptions. To ``/xpufleet/``
        routes it sends what the plugin's page sends (server/comfy/guard.py): ``X-XPUFleet-Request`` and,
        unless ``paired`` is False, the pairing, made on the first answer that asks for one (pair())."""
        status, answer = self._send(method, path, body, timeout, paired)
        if paired and status == 401 and isinstance(answer, dict) and answer.get("pairing") and self.pair():
            status, answer = self._send(method, path, body, timeout, paired)
        return status, answer

    def _send(self, method: str, path: str, body: Any, timeout: float, paired: bool) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if "/xpufleet/" in path:
            headers["X-XPUFleet-Request"] = "1"
            if paired and self.pairing:
                headers["X-XPUFleet-Pairing"] = self.pairing
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def pair(self) -> bool:
        """Pair this client the way a user pastes the token into the page (``POST
        /xpufleet/api/pairing/redeem``); False when no sidecar runs for this home."""
        from xpufleet.common.runtime_file import read_runtime

        info = read_runtime(self.home)
        if info is None:
            return False
        status, answer = self._send("POST", "/xpufleet/api/pairing/redeem",
                                    {"token": info["token"], "name": "comfy tests"}, 60.0, False)
        if status != 201:
            return False
        self.pairing = answer["pairing"]
        return True

    def get(self, path: str) -> Any:
        status, body = self.request("GET", path)
        assert status == 200, f"GET {path} -> {status}: {body}"
        return body

    # -- prompts --

    def run_prompt(self, graph: dict[str, Any], on_event: Any = None, timeout: float = PROMPT_TIMEOUT_S
                   ) -> PromptResult:
        """Queue ``graph`` and wait for its end on the websocket (``executing`` with node null, sent
        once the history is stored); ``on_event(event, client)`` sees every event on the way.

        Its own event loop is fine here: ComfyUI runs in its own process, and this loop holds only the
        client, whose ``async with`` blocks close the socket and the session when ``on_event`` or a wait
        raises (the sync comfy tests call it)."""
        return asyncio.run(self._run_prompt(graph, on_event, timeout))

    async def _run_prompt(self, graph: dict[str, Any], on_event: Any, timeout: float) -> PromptResult:
        import aiohttp

        client_id = uuid.uuid4().hex
        events: list[dict[str, Any]] = []
        async with aiohttp.ClientSession(self.url) as session:
            async with session.ws_connect(f"/ws?clientId={client_id}", heartbeat=30) as ws:
                async with session.post("/prompt", json={"prompt": graph, "client_id": client_id}) as resp:
                    queued = await resp.json()
                    if resp.status != 200:
                        raise PromptRefused(resp.status, queued)
                prompt_id = queued["prompt_id"]

                async def until_done() -> None:
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            continue  # binary frames are previews
                        event = json.loads(msg.data)
                        data = event.get("data") or {}
                        if data.get("prompt_id") not in (None, prompt_id):
                            continue
                        events.append(event)
                        if on_event is not None:
                            await on_event(event, session)
                        if event["type"] == "executing" and data.get("node") is None and \
                                data.get("prompt_id") == prompt_id:
                            return
                    raise RuntimeError("ComfyUI closed the websocket before the prompt ended")

                await asyncio.wait_for(until_done(), timeout)
            async with session.get(f"/history/{prompt_id}") as resp:
                history = (await resp.json())[prompt_id]
        return PromptResult(prompt_id, history, events)


class PromptRefused(Exception):
    """POST /prompt answered an error (ComfyUI's own validation)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status, self.body = status, body
        super().__init__(f"POST /prompt -> {status}: {json.dumps(body)[:2000]}")


def xpufleet_cli(*args: str, home: Path, cwd: Path, timeout: float = 300.0) -> subprocess.CompletedProcess:
    """``xpufleet ARGS`` from this test interpreter (the installed package), against ``home``."""
    env = {**os.environ, "XPUFLEET_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "xpufleet.server", *args], capture_output=True, text=True,
                          cwd=str(cwd), env=env, timeout=timeout)
