"""A real sidecar for end-to-end tests: started with the real CLI (`python -m xpufleet.server start
--port 0`) as a subprocess on loopback, with XPUFLEET_HOME in a temporary folder.

Test files load this module by path (tests have no packages under --import-mode=importlib):

    harness = load_harness()  # see the bottom of this file for the snippet the tests use
"""

from __future__ import annotations

import copy
import http.client
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import graph_parts as gp  # registered by tests/conftest.py
import psutil
from processes import stop_process  # registered by tests/conftest.py
from processes import wait_until as wait_until  # re-exported: the tests call harness.wait_until

from xpufleet.common.client import Client
from xpufleet.common.runtime_file import read_runtime

CLI = [sys.executable, "-m", "xpufleet.server"]

# A trivial but real graph: iris, a small MLP, a TrainingLoop and an Evaluate (output node).
IRIS_GRAPH: dict[str, Any] = gp.iris(strategy="single")


def iris_graph(epochs: int = 1, **loop_inputs: Any) -> dict[str, Any]:
    """The iris graph with ``epochs`` (a huge number = a run that lasts until cancelled)."""
    g = copy.deepcopy(IRIS_GRAPH)
    g["7"]["inputs"]["epochs"] = epochs
    g["7"]["inputs"].update(loop_inputs)
    return g


class Sidecar:
    """One sidecar process for one XPUFLEET_HOME."""

    def __init__(self, home: Path, env: dict[str, str] | None = None) -> None:
        self.home = Path(home)
        self.env = {**os.environ, "XPUFLEET_HOME": str(self.home), **(env or {})}
        self.env.pop("CUDA_VISIBLE_DEVICES", None)
        self.info: dict[str, Any] | None = None
        self.client: Client | None = None

    def cli(self, *args: str, timeout: float = 120.0, check: bool = False) -> subprocess.CompletedProcess:
        """Run ``xpufleet ARGS`` against this home."""
        proc = subprocess.run([*CLI, *args], env=self.env, capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"xpufleet {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
        return proc

    def start(self) -> Sidecar:
        self.cli("start", "--port", "0", check=True, timeout=90)
        self.info = read_runtime(self.home)
        assert self.info is not None, "start returned but wrote no runtime file"
        self.client = Client(self.info["url"], self.info["token"], timeout=30)
        return self

    @property
    def url(self) -> str:
        assert self.info is not None
        return self.info["url"]

    @property
    def pid(self) -> int:
        assert self.info is not None
        return int(self.info["pid"])

    def kill9(self) -> None:
        """SIGKILL the sidecar (its run children survive as orphans, as after a crash)."""
        os.kill(self.pid, signal.SIGKILL)
        psutil.Process(self.pid).wait(10) if psutil.pid_exists(self.pid) else None

    def stop(self) -> None:
        if self.info is None:
            return
        proc = self.cli("stop", timeout=120)
        if proc.returncode != 0 and psutil.pid_exists(self.pid):
            os.kill(self.pid, signal.SIGKILL)
        self.info = None

    def submit(self, graph: dict[str, Any], **options: Any) -> str:
        assert self.client is not None
        return self.client.submit(graph, options)["run_id"]

    def wait_for(self, run_id: str, event_type: str, timeout: float = 60.0) -> dict[str, Any]:
        """The first event of ``event_type`` (long-polls; bounded by ``timeout``)."""
        assert self.client is not None
        return first_event(self.client, run_id, event_type, timeout)

    def finish(self, run_id: str, timeout: float = 90.0) -> dict[str, Any]:
        """Wait for the run's run_finished event; return the run."""
        self.wait_for(run_id, "run_finished", timeout)
        assert self.client is not None
        return self.client.run(run_id)


def first_event(client: Client, run_id: str, event_type: str, timeout: float = 60.0, after: int = 0) -> dict[str, Any]:
    """The run's first event of ``event_type`` past cursor ``after`` (long-polls; bounded by ``timeout``)."""
    cursor, deadline = after, time.monotonic() + timeout
    while time.monotonic() < deadline:
        page = client.events(run_id, cursor=cursor, wait=min(10.0, max(0.1, deadline - time.monotonic())))
        for ev in page["events"]:
            if ev["type"] == event_type:
                return ev
        cursor = page["cursor"]
        if page["done"]:
            break
    seen = [e["type"] for e in client.events(run_id, limit=1000)["events"]][-20:]
    raise AssertionError(f"no {event_type} event for run {run_id} within {timeout} s; its last events: {seen}")


class AgentProcess:
    """``xpufleet agent start --foreground --name NAME`` as a child of the test, for the sidecar's
    machine (it reads ``home``'s runtime file), logging to ``<home>/test-agent-<name>.log``."""

    def __init__(self, sidecar: Sidecar, name: str, home: Path | None = None, *args: str,
                 env: dict[str, str] | None = None) -> None:
        self.name = name
        self.home = Path(home or sidecar.home)
        self.log = self.home / f"test-agent-{name}.log"
        env = {**sidecar.env, "XPUFLEET_HOME": str(self.home), "OMP_NUM_THREADS": "1", **(env or {})}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([*CLI, "agent", "start", "--foreground", "--name", name, *args],
                                         env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_connected(self, timeout: float = 90.0) -> None:
        """Until the agent's log says it connected (no push channel to the test); fails if it exits first."""

        def connected() -> bool:
            assert self.proc.poll() is None, f"agent {self.name} exited:\n{self.text()[-3000:]}"
            return "connected to" in self.text()

        wait_until(connected, f"agent {self.name} connected", timeout)

    def state(self) -> dict[str, Any]:
        """The agent's own state file (``agents/<name>.json``): state, reason, server."""
        path = self.home / "agents" / f"{self.name}.json"
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError):
            return {}

    def stop(self) -> None:
        stop_process(self.proc)


def write_graph(path: Path, graph: dict[str, Any]) -> Path:
    path.write_text(json.dumps(graph))
    return path

class Api:
    """Raw HTTP against one sidecar: (status, JSON answer, seconds)."""

    def __init__(self, sc: Sidecar) -> None:
        self.sc = sc

    def call(self, method: str, path: str, body: bytes | None = None, timeout: float = 60.0) -> tuple[int, Any, float]:
        info = self.sc.info
        conn = http.client.HTTPConnection(info["host"], info["port"], timeout=timeout)
        headers = {"Authorization": f"Bearer {info['token']}", "Content-Type": "application/json"}
        started = time.monotonic()
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
            data = resp.read()
        finally:
            conn.close()
        took = time.monotonic() - started
        try:
            return resp.status, json.loads(data) if data else None, took
        except ValueError:
            return resp.status, data.decode("utf-8", "replace"), took

    def post(self, path: str, obj: Any) -> tuple[int, Any, float]:
        return self.call("POST", path, json.dumps(obj).encode())


class Sampler(threading.Thread):
    """Calls ``probe()`` every ``every`` seconds until stopped, keeping each answer and how long it took."""

    def __init__(self, probe, every: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.probe = probe
        self.every = every
        self.samples: list[tuple[Any, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            started = time.monotonic()
            try:
                answer = self.probe()
            except Exception as exc:  # noqa: BLE001 - a timeout or reset is a sample too
                answer = exc
            self.samples.append((answer, time.monotonic() - started))
            self.halt.wait(self.every)

    def stop(self) -> list[tuple[Any, float]]:
        self.halt.set()
        self.join(30)
        return self.samples


def loops_ring(n: int) -> dict[str, Any]:
    """The probe's cycle: node i takes model=[i-1, 0], node 0 takes model=[n-1, 0], all TrainingLoops."""
    g = {str(i): {"class_type": "XPUTrainingLoop", "inputs": {"model": [str(i - 1), 0]}} for i in range(n)}
    g["0"]["inputs"]["model"] = [str(n - 1), 0]
    return g


def loops_chain(n: int) -> dict[str, Any]:
    """A valid graph of n nodes: iris, its loader, an MLP, an optimizer, a loss, then n-5 TrainingLoops,
    each training the previous one's model (one epoch each)."""
    g = {k: copy.deepcopy(IRIS_GRAPH[k]) for k in ("1", "2", "4", "5", "6")}
    loop = {k: v for k, v in IRIS_GRAPH["7"]["inputs"].items() if k != "val_dataloader"}
    for i in range(n - 5):
        g[f"t{i}"] = {"class_type": "XPUTrainingLoop", "inputs": {**loop, "model": ["4" if i == 0 else f"t{i - 1}", 0]}}
    return g


# --- the event loop's stalls, measured with GET /api/health (issue 19) -------------------------------------

# A health check waits at most this multiple of its own unloaded latency, plus the floor. The multiple
# covers the worker thread that does a request's heavy work holding the GIL in 1 ms slices while the loop
# answers (a health check gives up and takes back the GIL ~10 times); the floor covers the OS scheduler
# on a loaded 2-core machine: at load averages of 10-12 (5 sessions sharing it) single waits of 0.3 to
# 0.6 s were measured with the heavy work already off the loop, so 250 ms failed on noise. The stalls this
# catches were 2.1 s (the 5,000-node ring's estimate) and 7 to over 120 s on the chains and the sweep
# cancel (bench/bench_loop_stalls.py), so a 1 s floor still parts the bug from the noise.
HEALTH_STALL_FACTOR = 20.0
HEALTH_STALL_FLOOR_S = 1.0


def unloaded_health(api: Api, n: int = 30) -> float:
    """The median latency of ``n`` health checks with nothing else sent (the baseline)."""
    import statistics

    waits = []
    for _ in range(n):
        waits.append(api.call("GET", "/api/health", timeout=30)[2])
        time.sleep(0.005)
    return statistics.median(waits)


def health_bound(p50: float) -> float:
    """The longest a health check may wait while a request runs (see HEALTH_STALL_FACTOR)."""
    return HEALTH_STALL_FACTOR * p50 + HEALTH_STALL_FLOOR_S


# Test files use it as `import sidecar_harness as harness` (tests/server/conftest.py registers it).
