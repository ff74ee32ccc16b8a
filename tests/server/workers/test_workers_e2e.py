"""End to end: a real sidecar process and real agent processes on loopback, simulated cards (docs/architecture.md).

Every run here is a real graph (scikit-learn's iris, a small MLP) executed by the run child on the
agent, on the CPU, while scheduling, renumbering and the agent protocol work as for real cards.
Network cuts go through a loopback TCP proxy the test opens and closes; crashes are real SIGKILLs.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from fleet_harness import LineWatcher  # registered by tests/server/conftest.py

from xpufleet.server.agent.agent import default_name
from xpufleet.server.devices import set_simulated_free

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HEARTBEAT_S = "1"  # Degraded after 3 s without one: room for a loaded 2-core machine


def iris_graph(epochs: int, device: str = "auto", max_steps: int = 0) -> dict[str, Any]:
    """Train a small MLP on iris for ``epochs`` (each epoch is a few batches), then evaluate it."""
    return {
        "1": {"class_type": "XPUDataset", "inputs": {"name": "iris", "val_split": 0.2, "seed": 0,
                                                       "normalize": "standard"}},
        "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["1", 0], "batch_size": 32, "shuffle": True,
                                                          "num_workers": 0, "drop_last": False}},
        "4": {"class_type": "XPUMLP", "inputs": {"hidden": "16", "activation": "relu", "dropout": 0.0, "seed": 0,
                                                   "dataset_info": ["1", 2]}},
        "5": {"class_type": "XPUOptimizer", "inputs": {"name": "adam", "lr": 0.01, "weight_decay": 0.0,
                                                         "momentum": 0.9}},
        "6": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}},
        "8": {"class_type": "XPUTrainingLoop", "inputs": {
            "model": ["4", 0], "dataloader": ["2", 0], "optimizer": ["5", 0], "loss": ["6", 0],
            "epochs": epochs, "max_steps": max_steps, "device": device, "precision": "fp32",
            "accumulate_steps": 1, "grad_clip_norm": 0.0, "checkpoint_every": 0, "checkpoint_every_steps": 0,
            "seed": 0, "tensorboard": False, "strategy": "single"}},
        "9": {"class_type": "XPUEvaluate", "inputs": {"model": ["8", 0], "dataloader": ["2", 0], "device": "auto",
                                                        "precision": "fp32"}},
    }


# --- processes --------------------------------------------------------------------------------------

def base_env(home: Path, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"XPUFLEET_HOME": str(home), "XPUFLEET_HEARTBEAT_INTERVAL_S": HEARTBEAT_S,
                "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    env.pop("XPUFLEET_RUN_QUEUE_MAX_CONCURRENT", None)
    env.update(extra)
    return env


class SidecarProc:
    """``xpufleet start --foreground --port 0`` as a child; its URL from the ready pipe."""

    def __init__(self, home: Path, env: dict[str, str]) -> None:
        self.home = home
        self.env = env
        self.proc: subprocess.Popen | None = None
        self.url = ""
        self.token = ""
        self.start()

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        with open(self.home / "test-sidecar.log", "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "xpufleet.server", "start", "--foreground", "--port", "0",
                 "--ready-fd", str(write_fd)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, pass_fds=(write_fd,),
            )
        os.close(write_fd)
        ready, _, _ = select.select([read_fd], [], [], 60)
        line = os.read(read_fd, 4096).decode().strip() if ready else ""
        os.close(read_fd)
        assert line.startswith("http"), f"sidecar did not start: {line!r}"
        self.url = line
        self.token = json.loads((self.home / "runtime.json").read_text())["token"]

    def kill9(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Authorization": f"Bearer {self.token}",
                                              "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def submit(self, graph: dict[str, Any], **options: Any) -> str:
        status, body = self.call("POST", "/api/runs", {"graph": graph, "options": options})
        assert status == 201, body
        return body["run_id"]

    def run(self, run_id: str) -> dict[str, Any]:
        return self.call("GET", f"/api/runs/{run_id}")[1]

    def wait_run(self, run_id: str, statuses: set[str], timeout: float = 120.0) -> dict[str, Any]:
        """Long-poll the run's events until its status is one of ``statuses``."""
        deadline = time.monotonic() + timeout
        cursor = 0
        while time.monotonic() < deadline:
            status, body = self.call("GET", f"/api/runs/{run_id}/events?cursor={cursor}&wait=5")
            assert status == 200, body
            cursor = body["cursor"]
            if body["status"] in statuses:
                return self.run(run_id)
        raise AssertionError(f"run {run_id} is {self.run(run_id)['status']}, not {statuses}, after {timeout} s")

    def events(self, run_id: str) -> list[dict[str, Any]]:
        return self.call("GET", f"/api/runs/{run_id}/events?limit=1000")[1]["events"]

    def worker(self, name: str) -> dict[str, Any]:
        status, body = self.call("GET", f"/api/workers/{name}")
        assert status == 200, body
        return body

    def wait_worker(self, name: str, status: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            code, w = self.call("GET", f"/api/workers/{name}")
            if code == 200 and w["status"] == status:
                return w
            time.sleep(0.1)  # worker status has no push channel; bounded poll
        raise AssertionError(f"worker {name} not {status} after {timeout} s: {self.call('GET', '/api/workers')}")


class AgentProc:
    """``xpufleet agent start --foreground`` as a child, simulating cards."""

    def __init__(self, home: Path, env: dict[str, str], name: str, simulate: str, *extra: str) -> None:
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "xpufleet.server", "agent", "start", "--foreground", "--name", name,
             "--simulate", simulate, *extra],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        self.out = LineWatcher(self.proc.stdout, home / f"test-agent-{name}.log")
        self.out.start()

    def wait_connected(self, start: int = 0, timeout: float = 60.0) -> int:
        return self.out.wait_for("connected to", start, timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


class Proxy:
    """A loopback TCP proxy a test can cut (every connection closed, new ones refused) and restore."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.blocked = False
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.blocked:
                client.close()
                continue
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target_port))
            except OSError:
                client.close()
                continue
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def cut(self) -> None:
        self.blocked = True
        with self.lock:
            conns, self.conns = self.conns, []
        for s in conns:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def restore(self) -> None:
        self.blocked = False

    def close(self) -> None:
        self.cut()
        self.listener.close()


@pytest.fixture
def fleet(tmp_path):
    """Start processes through ``fleet``; everything started is stopped at the end."""
    started: list[Any] = []

    class Fleet:
        home = tmp_path / "home"

        def env(self, **extra: str) -> dict[str, str]:
            return base_env(self.home, **extra)

        def sidecar(self, **extra: str) -> SidecarProc:
            self.home.mkdir(exist_ok=True)
            sc = SidecarProc(self.home, self.env(**extra))
            started.append(sc)
            return sc

        def agent(self, name: str, simulate: str, *args: str, env: dict[str, str] | None = None) -> AgentProc:
            a = AgentProc(self.home, env or self.env(), name, simulate, *args)
            started.append(a)
            return a

        def proxy(self, port: int) -> Proxy:
            p = Proxy(port)
            started.append(p)
            return p

    yield Fleet()
    for thing in reversed(started):
        if isinstance(thing, AgentProc):
            thing.stop()
    for thing in reversed(started):
        if isinstance(thing, SidecarProc):
            thing.stop()
        elif isinstance(thing, Proxy):
            thing.close()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _child_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events that came from the run child (the server adds status / cancel_requested of its own)."""
    return [e for e in events if e["type"] not in ("status", "cancel_requested")]


def _agent_events(home: Path, agent: str, run_id: str) -> list[dict[str, Any]]:
    path = home / "agents" / agent / "runs" / run_id / "events.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_agent_finished(home: Path, agent: str, run_id: str, timeout: float = 120.0) -> list[dict[str, Any]]:
    """The run child's own record on the agent (events.jsonl) once it holds run_finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        evs = _agent_events(home, agent, run_id)
        if evs and evs[-1]["type"] == "run_finished":
            return evs
        time.sleep(0.1)  # a file written by another process: bounded poll
    raise AssertionError(f"run {run_id} did not finish on agent {agent}")


def _run_pid(sc: SidecarProc, run_id: str, timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for e in sc.events(run_id):
            if e["type"] == "run_started":
                return int(e["payload"]["pid"])
        sc.call("GET", f"/api/runs/{run_id}/events?cursor=0&wait=2")
    raise AssertionError(f"run {run_id} never started")


# --- the tests ----------------------------------------------------------------------------------------

def test_run_lands_on_the_named_worker_and_card_renumbered(fleet):
    sc = fleet.sidecar()
    agent = fleet.agent("box", "cuda:0=24,cuda:1=24,cuda:2=24")
    agent.wait_connected()
    renumbered = sc.submit(iris_graph(2, device="cuda:1"), target={"worker": "box", "devices": ["cuda:2", "cuda:0"]})
    fallback = sc.submit(iris_graph(2, device="cuda:1"), target={"worker": "box", "devices": ["cuda:1"]})
    run = sc.wait_run(renumbered, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    assert run["worker_id"] == "box" and run["devices"] == ["cuda:2", "cuda:0"]
    facts = run["execution_facts"]
    assert facts["visible_devices"] == ["cuda:0", "cuda:1"]
    assert facts["device_aliases"] == {"cuda:0": "cuda:2", "cuda:1": "cuda:0"}
    assert facts["env"]["CUDA_VISIBLE_DEVICES"] == "2,0"
    assert facts["simulated_devices"] is True and facts["placement"] == "worker"
    assert not [w for w in run["warnings"] if w.get("kind") == "device_fallback"]
    run = sc.wait_run(fallback, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    msgs = [w["message"] for w in run["warnings"] if w.get("kind") == "device_fallback"]
    assert any("is set to device cuda:1; this run has 1 card (cuda:0 = the worker's cuda:1), so when it "
               "executes, it runs on cuda:0." in m for m in msgs), run["warnings"]
    w = sc.worker("box")
    assert w["simulated"] is True and all(d["simulated"] for d in w["devices"] if d["kind"] == "cuda")
    assert w["runs"] == [] and w["status"] == "Online"
    # a test changes a simulated card's free figure while the agent runs: the next heartbeat carries it
    set_simulated_free(fleet.home, "box", "cuda:2", 5.5)
    deadline = time.monotonic() + 10 * float(HEARTBEAT_S)
    card: dict[str, Any] = {}
    while time.monotonic() < deadline:
        card = next(d for d in sc.worker("box")["devices"] if d["name"] == "cuda:2")
        if card["free_gib"] == 5.5:
            break
        time.sleep(float(HEARTBEAT_S) / 5)  # heartbeats have no push channel to the test: bounded poll
    assert card["free_gib"] == 5.5 and card["total_gib"] == 24.0 and card["simulated"] is True, card
    # the CLI shows the same (the Workers panel's fields), and drains
    cli = [sys.executable, "-m", "xpufleet.server", "workers"]
    shown = subprocess.run(cli, env=fleet.env(), capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "box: Online" in shown.stdout, shown.stdout + shown.stderr
    assert "cuda:2 [simulated]: 5.5/24.0 GiB free, slots 0/1, exclusive" in shown.stdout
    assert "cuda:0 [simulated]: 24.0/24.0 GiB free" in shown.stdout and "simulated cards" in shown.stdout
    listed = subprocess.run([*cli, "list", "--json"], env=fleet.env(), capture_output=True, text=True, timeout=60)
    assert json.loads(listed.stdout)["workers"][0]["devices"][3]["simulated"] is True
    drained = subprocess.run([*cli, "drain", "box"], env=fleet.env(), capture_output=True, text=True, timeout=60)
    assert drained.returncode == 0 and "box: Draining" in drained.stdout
    assert sc.worker("box")["status"] == "Draining"
    undrained = subprocess.run([*cli, "undrain", "box"], env=fleet.env(), capture_output=True, text=True, timeout=60)
    assert undrained.returncode == 0 and "worker box: Online" in undrained.stdout
    missing = subprocess.run([*cli, "drain", "nobody"], env=fleet.env(), capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "no worker named 'nobody'" in missing.stderr


def test_any_goes_by_name_sidecar_last_and_bad_targets_are_400(fleet):
    sc = fleet.sidecar(XPUFLEET_RUN_QUEUE_MAX_CONCURRENT="alpha/cpu=1,zeta/cpu=1")
    zeta = fleet.agent("zeta", "cuda:0=24")
    zeta.wait_connected()  # zeta connects first; alpha still comes first by name
    alpha = fleet.agent("alpha", "cuda:0=24,cuda:1=24")
    alpha.wait_connected()
    for options, needle in [
        ({"target": "nobody"}, "unknown worker 'nobody'"),
        ({"target": {"worker": "alpha", "devices": ["cuda:7"]}}, "worker 'alpha' does not offer cuda:7"),
        ({"target": {"worker": "any", "devices": ["cuda:0", "cuda:5"]}}, "runs on workers only"),
        ({"target": {"worker": "local", "devices": ["cuda:0"]}}, "this server does not offer cuda:0 (it offers cpu)"),
    ]:
        status, body = sc.call("POST", "/api/runs", {"graph": iris_graph(1), "options": options})
        assert status == 400 and needle in body["error"], (options, body)
    pair = sc.submit(iris_graph(2), target={"worker": "any", "devices": ["cuda:0", "cuda:1"]})
    single = sc.submit(iris_graph(2), target="any", device="cuda")
    cpus = [sc.submit(iris_graph(1), target="any", device="cpu") for _ in range(3)]
    got = {rid: sc.wait_run(rid, {"succeeded", "failed"}) for rid in [pair, single, *cpus]}
    assert all(r["status"] == "succeeded" for r in got.values()), {k: r["error"] for k, r in got.items()}
    assert (got[pair]["worker_id"], got[pair]["devices"]) == ("alpha", ["cuda:0", "cuda:1"])
    assert (got[single]["worker_id"], got[single]["devices"]) == ("zeta", ["cuda:0"])  # alpha's cards were busy
    # any + cpu: alpha, then zeta (each limited to 1 cpu run), then this server last
    assert [got[r]["worker_id"] for r in cpus] == ["alpha", "zeta", None]
    assert got[cpus[2]]["placement"] == "local"


def test_kill9_of_one_run_fails_that_run_only(fleet):
    sc = fleet.sidecar()
    agent = fleet.agent("box", "cuda:0=24,cuda:1=24")
    agent.wait_connected()
    doomed = sc.submit(iris_graph(2000), target={"worker": "box", "devices": ["cuda:0"]})
    other = sc.submit(iris_graph(15), target={"worker": "box", "devices": ["cuda:1"]})
    pid = _run_pid(sc, doomed)
    _run_pid(sc, other)
    os.kill(pid, signal.SIGKILL)
    run = sc.wait_run(doomed, {"succeeded", "failed", "interrupted"})
    assert run["status"] == "failed" and "SIGKILL" in run["error"] and "box" in run["error"]
    run = sc.wait_run(other, {"succeeded", "failed", "interrupted"})
    assert run["status"] == "succeeded", run["error"]
    assert sc.worker("box")["connected"] is True  # the agent and its connection survived
    assert agent.proc.poll() is None
    # stopping the agent stops its runs; they end interrupted and the server hears it before it goes
    last = sc.submit(iris_graph(2000), target={"worker": "box", "devices": ["cuda:0"]})
    _run_pid(sc, last)
    agent.stop()
    assert agent.proc.returncode == 0
    run = sc.wait_run(last, {"succeeded", "failed", "interrupted", "cancelled"})
    assert run["status"] == "interrupted" and "the agent on worker box was stopped" in run["error"]


def _joined_agent_through_proxy(fleet: Any, sc: SidecarProc, name: str, simulate: str, env: dict[str, str]):
    proxy = fleet.proxy(_port(sc.url))
    status, tok = sc.call("POST", "/api/workers/join-tokens", {"name": name})
    assert status == 201
    agent = fleet.agent(name, simulate, "--server", f"http://127.0.0.1:{proxy.port}", "--join", tok["join_token"],
                        env=env)
    agent.wait_connected()
    assert sc.worker(name)["auth"] == "credential"
    return proxy, agent


def test_cut_shorter_than_the_grace_loses_nothing(fleet):
    env = fleet.env(XPUFLEET_WORKER_RESUME_GRACE_S="120")
    sc = fleet.sidecar(XPUFLEET_WORKER_RESUME_GRACE_S="120")
    proxy, agent = _joined_agent_through_proxy(fleet, sc, "remote", "cuda:0=16", env)
    run_id = sc.submit(iris_graph(60), target={"worker": "remote", "devices": ["cuda:0"]})
    sc.wait_run(run_id, {"running"})
    proxy.cut()
    sc.wait_worker("remote", "Disconnected")
    child = _wait_agent_finished(fleet.home, "remote", run_id)  # the run finished while cut off
    assert child[-1]["payload"]["status"] == "succeeded"
    assert sc.run(run_id)["status"] == "running"  # the server holds the run for the grace
    mark = len(agent.out.lines)
    proxy.restore()
    agent.wait_connected(start=mark)
    run = sc.wait_run(run_id, {"succeeded", "failed", "interrupted"})
    assert run["status"] == "succeeded", run["error"]
    stored = _child_events(sc.events(run_id))
    assert [(e["type"], e["payload"]) for e in stored] == [(e["type"], e["payload"]) for e in child][:-1] + [
        (stored[-1]["type"], stored[-1]["payload"])]
    assert len(stored) == len(child) and stored[-1]["type"] == "run_finished"
    metrics = [e for e in stored if e["type"] == "metric"]
    assert len(metrics) == sum(1 for e in child if e["type"] == "metric") > 0


def test_cut_longer_than_the_grace_interrupts(fleet):
    sc = fleet.sidecar(XPUFLEET_WORKER_RESUME_GRACE_S="3")
    # the remote agent's environment does not set the grace: it follows the server's (sent in welcome)
    proxy, agent = _joined_agent_through_proxy(fleet, sc, "remote", "cuda:0=16", fleet.env())
    run_id = sc.submit(iris_graph(5000), target={"worker": "remote", "devices": ["cuda:0"]})
    sc.wait_run(run_id, {"running"})
    proxy.cut()
    run = sc.wait_run(run_id, {"succeeded", "failed", "interrupted", "cancelled"}, timeout=60)
    assert run["status"] == "interrupted" and "XPUFLEET_WORKER_RESUME_GRACE_S" in run["error"]
    child = _wait_agent_finished(fleet.home, "remote", run_id, timeout=60)  # the agent stopped it too
    assert child[-1]["payload"]["status"] == "interrupted"
    mark = len(agent.out.lines)
    proxy.restore()
    agent.wait_connected(start=mark)
    w = sc.wait_worker("remote", "Online")
    assert w["runs"] == [] and sc.run(run_id)["status"] == "interrupted"


def test_agent_start_with_zero_arguments_next_to_the_sidecar_then_status_and_stop(fleet):
    sc = fleet.sidecar()
    cli = [sys.executable, "-m", "xpufleet.server", "agent"]
    name = default_name()
    start = subprocess.run([*cli, "start"], env=fleet.env(), capture_output=True, text=True, timeout=90)
    try:
        assert start.returncode == 0, start.stdout + start.stderr
        assert f"worker agent {name} connected to {sc.url}" in start.stdout
        w = sc.wait_worker(name, "Online", timeout=10)
        assert w["auth"] == "session" and w["version_match"] is True and w["simulated"] is False
        assert w["devices"][0]["name"] == "cpu" and not any(d["simulated"] for d in w["devices"])
        again = subprocess.run([*cli, "start"], env=fleet.env(), capture_output=True, text=True, timeout=60)
        assert again.returncode == 0 and "already running" in again.stdout
        status = subprocess.run([*cli, "status"], env=fleet.env(), capture_output=True, text=True, timeout=30)
        assert status.returncode == 0 and f"{name}: connected" in status.stdout, status.stdout
        assert "[simulated cards]" not in status.stdout
    finally:
        stop = subprocess.run([*cli, "stop"], env=fleet.env(), capture_output=True, text=True, timeout=90)
    assert stop.returncode == 0 and f"worker agent {name} stopped" in stop.stdout, stop.stdout + stop.stderr
    status = subprocess.run([*cli, "status"], env=fleet.env(), capture_output=True, text=True, timeout=30)
    assert status.returncode == 1 and f"{name}: not running" in status.stdout
    assert sc.wait_worker(name, "Disconnected", timeout=10)["connected"] is False


def test_sidecar_kill9_mid_run_is_taken_over(fleet):
    sc = fleet.sidecar()
    # zero arguments on the sidecar's machine: address and session token from the runtime file
    start = subprocess.run(
        [sys.executable, "-m", "xpufleet.server", "agent", "start", "--name", "box", "--simulate", "cuda:0=8"],
        env=fleet.env(), capture_output=True, text=True, timeout=90)
    assert start.returncode == 0 and "connected to" in start.stdout, start.stdout + start.stderr
    try:
        status = subprocess.run([sys.executable, "-m", "xpufleet.server", "agent", "status"], env=fleet.env(),
                                capture_output=True, text=True, timeout=30)
        assert status.returncode == 0 and "box: connected" in status.stdout and "[simulated cards]" in status.stdout
        sc.wait_worker("box", "Online", timeout=10)
        run_id = sc.submit(iris_graph(40), target={"worker": "box", "devices": ["cuda:0"]})
        sc.wait_run(run_id, {"running"})
        sc.kill9()
        sc.start()  # same home, new port, new session token: the agent finds it through runtime.json
        run = sc.wait_run(run_id, {"succeeded", "failed", "interrupted"})
        assert run["status"] == "succeeded", run["error"]
        child = _agent_events(fleet.home, "box", run_id)
        stored = _child_events(sc.events(run_id))
        assert len(stored) == len(child) and [e["type"] for e in stored] == [e["type"] for e in child]
        w = sc.wait_worker("box", "Online")
        assert w["connected_since_start"] is True
    finally:
        stop = subprocess.run([sys.executable, "-m", "xpufleet.server", "agent", "stop", "--name", "box"],
                              env=fleet.env(), capture_output=True, text=True, timeout=90)
    assert stop.returncode == 0 and "stopped" in stop.stdout


def _workers_cli(fleet: Any, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "xpufleet.server", "workers", *args], env=fleet.env(),
                          capture_output=True, text=True, timeout=60)


def test_revoked_and_wrong_credentials_are_refused(fleet, tmp_path):
    sc = fleet.sidecar()
    shown = _workers_cli(fleet, "join-token", "--name", "remote")
    assert shown.returncode == 0 and "on the worker machine, run:" in shown.stdout, shown.stdout + shown.stderr
    assert f"xpufleet agent start --server {sc.url} --join " in shown.stdout and "--name remote" in shown.stdout
    tok = json.loads(_workers_cli(fleet, "join-token", "--name", "remote", "--json").stdout)
    remote_home = tmp_path / "remote-machine"  # a remote worker keeps its own state
    agent = fleet.agent("remote", "cuda:0=16", "--server", sc.url, "--join", tok["join_token"],
                        env=base_env(remote_home))
    agent.wait_connected()
    cred_file = remote_home / "agents" / "remote.credential.json"
    assert oct(cred_file.stat().st_mode & 0o777) == "0o600"
    joined = json.loads(cred_file.read_text())["credential"]
    # reissue: the connected worker gets (and stores) a new credential
    reissued = _workers_cli(fleet, "reissue", "remote")
    assert reissued.returncode == 0 and "new credential delivered" in reissued.stdout, reissued.stdout
    cred = joined
    deadline = time.monotonic() + 30
    while cred == joined and time.monotonic() < deadline:
        time.sleep(0.1)  # a file another process writes: bounded poll
        cred = json.loads(cred_file.read_text())["credential"]
    assert cred != joined
    # another machine presenting a wrong credential for this name: refused, under "Rejected connections"
    other_home = tmp_path / "impostor-machine"
    (other_home / "agents").mkdir(parents=True)
    forged = other_home / "agents" / "remote.credential.json"
    forged.write_text(json.dumps({"server": sc.url, "credential": "not-the-credential"}))
    impostor = fleet.agent("remote", "cuda:0=16", "--server", sc.url, env=base_env(other_home))
    impostor.out.wait_for("refused this agent")
    impostor.stop()
    rejected = sc.call("GET", "/api/workers/rejected")[1]["rejected"]
    assert rejected[0]["name"] == "remote" and "bad credential" in rejected[0]["reason"]
    w = sc.worker("remote")
    assert w["last_rejection"]["reason"].startswith("bad credential") and w["connected"] is True
    # remove: the credential is revoked and the agent is told so (it exits)
    removed = _workers_cli(fleet, "remove", "remote")
    assert removed.returncode == 0 and "worker remote removed (0 waiting run(s) failed" in removed.stdout
    assert agent.proc.wait(timeout=60) == 0 and agent.out.count("was removed") >= 1
    forged.write_text(json.dumps({"server": sc.url, "credential": cred}))  # the revoked credential
    again = fleet.agent("remote", "cuda:0=16", "--server", sc.url, env=base_env(other_home))
    again.out.wait_for("refused this agent")
    again.stop()
    assert "no credential is valid" in sc.call("GET", "/api/workers/rejected")[1]["rejected"][0]["reason"]
    assert sc.call("GET", "/api/workers/remote")[0] == 404
    # an agent of another xpufleet version: refused at every retry, listed once with its version
    old_agent = subprocess.Popen(
        [sys.executable, "-c", "import sys, xpufleet.constants as c; c.VERSION = '0.0.9'; "
         "from xpufleet.server.cli.main import main; sys.exit(main(sys.argv[1:]))",
         "agent", "start", "--foreground", "--name", "old-box"],
        env=fleet.env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    out = LineWatcher(old_agent.stdout, fleet.home / "test-agent-old-box.log")
    out.start()
    try:
        first = out.wait_for("refused this agent: version mismatch")
        out.wait_for("refused this agent: version mismatch", first + 1)  # it retried
    finally:
        old_agent.terminate()
        old_agent.wait(timeout=60)
    rows = [r for r in sc.call("GET", "/api/workers/rejected")[1]["rejected"] if r["name"] == "old-box"]
    assert len(rows) == 1 and rows[0]["version"] == "0.0.9", rows
    assert rows[0]["reason"].startswith("version mismatch: the agent runs xpufleet 0.0.9, the server ")
    assert sc.call("GET", "/api/workers/old-box")[0] == 404  # refused agents get no worker card
    shown = subprocess.run([sys.executable, "-m", "xpufleet.server", "workers", "rejected"], env=fleet.env(),
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "old-box from 127.0.0.1: version mismatch" in shown.stdout, shown.stdout


def test_two_agents_simulating_one_uuid_are_one_card(fleet):
    sc = fleet.sidecar(XPUFLEET_RUN_QUEUE_MAX_CONCURRENT="a-box/cuda:0=3,b-box/cuda:0=2")
    a = fleet.agent("a-box", "cuda:0=24@GPU-shared-card")
    b = fleet.agent("b-box", "cuda:0=24@GPU-shared-card")
    a.wait_connected()
    b.wait_connected()
    wa, wb = sc.worker("a-box"), sc.worker("b-box")
    card_a = next(d for d in wa["devices"] if d["name"] == "cuda:0")
    card_b = next(d for d in wb["devices"] if d["name"] == "cuda:0")
    assert card_a["slot_limit"] == card_b["slot_limit"] == 2 and card_a["limit_from"] == "b-box"
    assert card_a["same_card_as"] == [{"provider": "b-box", "device": "cuda:0"}]
    assert any("for cuda:0 on a-box is lowered to 2" in w for w in wa["warnings"])
    runs = [sc.submit(iris_graph(3000), target={"worker": "a-box", "devices": ["cuda:0"]}) for _ in range(2)]
    third = sc.submit(iris_graph(1), target={"worker": "b-box", "devices": ["cuda:0"]})
    for rid in runs:
        sc.wait_run(rid, {"running"})
    waiting = sc.run(third)
    assert waiting["status"] == "queued" and "busy (2 of 2 slots used" in waiting["waiting_reason"]
    card = next(d for d in sc.worker("b-box")["devices"] if d["name"] == "cuda:0")
    assert card["slots_used"] == 2
    for rid in runs:
        assert sc.call("POST", f"/api/runs/{rid}/cancel")[0] == 200
    assert sc.wait_run(third, {"succeeded", "failed"})["status"] == "succeeded"
    assert {sc.run(r)["status"] for r in runs} == {"cancelled"}
