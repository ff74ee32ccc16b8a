"""End to end: a real sidecar and two real agents simulating one CUDA card each (docs/architecture.md), real run
processes training on digits, the real CLI (docs/sweeps.md, issue 15's "Must show").

* a four-variant learning-rate sweep (samples/sweep_lr.yaml on CUDA cards only) runs two at a time,
  read from the runs' own start and end times; the ranked table, its CSV, the live CLI;
* a sweep or study a single run would be refused is refused whole, with nothing queued;
* an Optuna study on digits finds a learning rate that beats the base graph's val_accuracy and prunes;
* cancelling a sweep leaves no child running (their processes are gone);
* budgets on shared cards (docs/memory.md) through the same per-run admission: no budget, one larger than every
  usable card, or ``wait: false`` with no fit now rejects the sweep (or study) whole.
"""

from __future__ import annotations

import copy
import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py
import yaml

from xpufleet.common.client import ApiError
from xpufleet.server.cli.specs import load_spec

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = REPO / "samples" / "sweep_lr.yaml"
DIGITS = json.loads((REPO / "samples" / "mlp_digits.json").read_text())
CLI = [sys.executable, "-m", "xpufleet.server"]


class Agent:
    """``xpufleet agent start --foreground`` simulating cards, its output in a log file."""

    def __init__(self, home: Path, env: dict[str, str], name: str, simulate: str) -> None:
        self.name = name
        self.log = home / f"test-agent-{name}.log"
        self.proc = subprocess.Popen([*CLI, "agent", "start", "--foreground", "--name", name, "--simulate", simulate],
                                     env=env, stdout=open(self.log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                     stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


class Fleet:
    """One sidecar (the real CLI, in the background) and the agents a test starts; all stopped at the end."""

    def __init__(self, home: Path) -> None:
        self.home = home
        env = {"XPUFLEET_HEARTBEAT_INTERVAL_S": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        self.sidecar = harness.Sidecar(home, env)
        self.sidecar.env.pop("XPUFLEET_RUN_QUEUE_MAX_CONCURRENT", None)
        self.sidecar.start()
        self.client = self.sidecar.client
        self.agents: list[Agent] = []

    def agent(self, name: str, simulate: str = "cuda:0=24") -> Agent:
        a = Agent(self.home, self.sidecar.env, name, simulate)
        self.agents.append(a)
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:  # the Workers list has no push channel: a bounded poll
            status, worker = self.call("GET", f"/api/workers/{name}")  # 404 until it has connected
            if status == 200 and worker["status"] == "Online":
                return a
            assert a.proc.poll() is None, self.agent_log(a)
            time.sleep(0.2)
        raise AssertionError(f"agent {name} did not connect: {self.agent_log(a)}")

    def warm(self, *workers: str) -> None:
        """One short run on each worker's cuda:0, all at once, waited for: an agent's first run waits for
        its warm-start parent (torch imported), which on a loaded machine takes many seconds, so a test
        that reads start times from the runs after this one compares runs that start when they are placed."""
        ids = [self.sidecar.submit(harness.iris_graph(1), name=f"warm {w}", target={"worker": w, "devices": ["cuda:0"]})
               for w in workers]
        for rid in ids:
            assert self.sidecar.finish(rid, timeout=300)["status"] == "succeeded"

    @staticmethod
    def agent_log(a: Agent) -> str:
        return a.log.read_text(errors="replace")[-3000:] if a.log.exists() else ""

    def call(self, method: str, path: str, body: Any = None, **params: Any) -> tuple[int, Any]:
        try:
            return 200, self.client.request(method, path, body, params=params or None)
        except ApiError as exc:
            return exc.status, exc.body

    def runs_total(self) -> int:
        return self.client.runs(limit=1)["total"]

    def wait_sweep(self, sweep_id: str, done: Any, timeout: float = 400) -> dict[str, Any]:
        """Long-poll the sweep until ``done(sweep)``."""
        deadline, version = time.monotonic() + timeout, -1
        while time.monotonic() < deadline:
            sweep = self.client.request("GET", f"/api/sweeps/{sweep_id}", params={"version": version, "wait": 10},
                                        timeout=40)
            if done(sweep):
                return sweep
            version = sweep["version"]
        raise AssertionError(f"sweep {sweep_id} never got there: {sweep['status']} {sweep['counts']}")

    def wait_study(self, study_id: str, timeout: float = 500) -> dict[str, Any]:
        deadline, version = time.monotonic() + timeout, -1
        while time.monotonic() < deadline:
            study = self.client.request("GET", f"/api/studies/{study_id}", params={"version": version, "wait": 10},
                                        timeout=40)
            if study["status"] not in ("running", "cancelling"):
                return study
            version = study["version"]
        raise AssertionError(f"study {study_id} still {study['status']}: {study['counts']}")

    def close(self) -> None:
        for a in self.agents:
            a.stop()
        self.sidecar.stop()


@pytest.fixture
def fleet(tmp_path):
    f = Fleet(tmp_path / "home")
    try:
        yield f
    finally:
        f.close()


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most runs running at one instant, from their (started_at, finished_at)."""
    return max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans)


def spec_file(tmp_path: Path, **changes: Any) -> Path:
    """samples/sweep_lr.yaml with ``changes`` merged in (graph path kept pointing at the example)."""
    spec = yaml.safe_load(EXAMPLE.read_text())
    spec["graph"] = str(REPO / "samples" / spec["graph"])
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_a_four_variant_sweep_runs_two_at_a_time_on_two_one_card_agents(fleet, tmp_path):
    fleet.agent("alpha")
    fleet.agent("beta")
    fleet.warm("alpha", "beta")
    warmed = fleet.runs_total()
    spec = spec_file(tmp_path, options={"device": "cuda", "target": {"worker": "any"}},
                     set={"10.location": "run_dir", "8.tensorboard": False})
    out_csv = tmp_path / "table.csv"
    cli = subprocess.run([*CLI, "sweep", str(spec), "--csv", str(out_csv)], env=fleet.sidecar.env,
                         capture_output=True, text=True, timeout=500)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    assert "queued sweep" in cli.stderr and "best: variant" in cli.stderr
    assert "RANK" in cli.stdout and "5.lr" in cli.stdout and "finished" in cli.stdout  # the live table
    sweep_id = cli.stderr.split("queued sweep ", 1)[1].split(":", 1)[0]
    sweep = fleet.client.request("GET", f"/api/sweeps/{sweep_id}")
    assert sweep["status"] == "finished" and sweep["counts"] == {"succeeded": 4} and sweep["n_runs"] == 4
    table = sweep["table"]
    assert [r["rank"] for r in table] == [1, 2, 3, 4]
    assert [r["metric"] for r in table] == sorted((r["metric"] for r in table), reverse=True)
    assert sorted(r["parameters"]["5.lr"] for r in table) == [0.0005, 0.002, 0.008, 0.03]
    for r in table:
        assert r["worker_id"] in ("alpha", "beta") and r["devices"] == ["cuda:0"] and r["queue_key"] == "any/cuda"
        run = fleet.client.run(r["run_id"])
        assert run["final_metrics"]["val_accuracy"] == r["metric"] and run["execution_facts"]["simulated_devices"]
    assert {r["worker_id"] for r in table} == {"alpha", "beta"}
    assert len({r["created_at"] for r in table}) == 4 and fleet.runs_total() == warmed + 4
    runs = sorted((fleet.client.run(r["run_id"]) for r in table), key=lambda r: r["assigned_at"])
    first_end = min(runs[0]["finished_at"], runs[1]["finished_at"])
    assert runs[1]["assigned_at"] < first_end  # two placed together (before either ended) ...
    assert runs[2]["assigned_at"] >= first_end and runs[3]["assigned_at"] >= first_end  # ... the others waited
    spans = [(r["started_at"], r["finished_at"]) for r in table]
    assert max_overlap(spans) == 2, spans  # two at a time: never three, and two did overlap
    for worker in ("alpha", "beta"):  # one card each: a worker's own variants never overlap
        assert max_overlap([(r["started_at"], r["finished_at"]) for r in table if r["worker_id"] == worker]) == 1
    assert sweep["best"]["run_id"] == table[0]["run_id"]
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [row["run_id"] for row in rows] == [r["run_id"] for r in table]
    assert all(row["5.lr"] and row["worker_id"] in ("alpha", "beta") and row["devices"] == "cuda:0"
               and row["queue_key"] == "any/cuda" and float(row["val_accuracy"]) > 0 for row in rows)
    raw = fleet.client.request("GET", f"/api/sweeps/{sweep_id}/table.csv", raw=True).decode()
    assert raw == out_csv.read_text()
    listed = subprocess.run([*CLI, "sweeps"], env=fleet.sidecar.env, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0 and sweep_id[:8] in listed.stdout and "4 succeeded" in listed.stdout



def test_seeded_variants_on_one_worker_each_run_in_their_own_process_in_parallel(fleet):
    fleet.agent("box", "cuda:0=24,cuda:1=24")
    fleet.warm("box")
    body = load_spec(str(EXAMPLE))
    body.update(parameters={}, seeds=[0, 1], options={"device": "cuda", "target": {"worker": "box"}},
                set={"8.epochs": 6, "8.tensorboard": False, "8.checkpoint_every": 0, "10.location": "run_dir"})
    status, created = fleet.call("POST", "/api/sweeps", body)
    assert status == 200 and created["n_runs"] == 2
    sweep = fleet.wait_sweep(created["sweep_id"], lambda s: s["status"] == "finished", timeout=300)
    assert sweep["counts"] == {"succeeded": 2}
    runs = [fleet.client.run(r["run_id"]) for r in sweep["table"]]
    assert sorted(r["seed"] for r in runs) == [0, 1] and {r["worker_id"] for r in runs} == {"box"}
    assert sorted(d for r in runs for d in r["devices"]) == ["cuda:0", "cuda:1"]  # a card each, at once
    assert max_overlap([(r["started_at"], r["finished_at"]) for r in runs]) == 2
    pids = {e["payload"]["pid"] for r in runs
            for e in fleet.client.request("GET", f"/api/runs/{r['id']}/events", params={"type": "run_started"})["events"]}
    assert len(pids) == 2  # each in its own process
    point = sweep["points"][0]
    assert sweep["points"] and point["runs"] == 2 and point["succeeded"] == 2 and point["std"] is not None
    assert min(r["metric"] for r in sweep["table"]) <= point["mean"] <= max(r["metric"] for r in sweep["table"])

def test_a_sweep_or_study_one_run_would_reject_is_rejected_whole_with_nothing_queued(fleet, tmp_path):
    fleet.agent("alpha")
    body = load_spec(str(EXAMPLE))
    before = fleet.runs_total()
    for options, needle in [
        ({"target": "nobody"}, "unknown worker 'nobody'"),
        ({"target": {"worker": "alpha", "devices": ["cuda:5"]}}, "worker 'alpha' does not offer cuda:5"),
        ({"target": {"worker": "any", "devices": ["cuda:0", "cuda:1"]}}, "no worker seen since the server started "
                                                                          "offers cuda:0, cuda:1"),
        ({"target": {"worker": "local", "devices": ["cuda:0"]}}, "this server does not offer cuda:0 (it offers cpu)"),
        ({"target": {"worker": "local", "memory_gib": 4}}, "options.target.memory_gib on a run this server may run"),
    ]:
        status, answer = fleet.call("POST", "/api/sweeps", {**body, "options": options})
        assert status == 400 and needle in answer["error"], (options, answer)
        study = {k: v for k, v in body.items() if k not in ("mode",)} | {
            "parameters": {"5.lr": {"low": 1e-4, "high": 0.1, "log": True}}, "n_trials": 4, "options": options}
        status, answer = fleet.call("POST", "/api/studies", study)
        assert status == 400 and needle in answer["error"], (options, answer)
    # one variant of four a local run would refuse (its graph fails validation here): the whole sweep goes
    status, answer = fleet.call("POST", "/api/sweeps", {**body, "options": {},
                                                        "parameters": {"5.lr": [0.001, 0.002, -3.0, 0.01]}})
    assert status == 400 and answer["error"].startswith("variant 2 (5.lr=-3): graph: ") and answer["variant"] == 2
    assert "nothing was queued" in answer["error"] and "5" in answer["node_errors"]
    assert fleet.runs_total() == before == 0  # the runs list is unchanged
    assert fleet.client.request("GET", "/api/sweeps")["total"] == 0
    assert fleet.client.request("GET", "/api/studies")["total"] == 0
    # the CLI says so and exits 2
    bad = spec_file(tmp_path, options={"target": "nobody"})
    cli = subprocess.run([*CLI, "sweep", str(bad)], env=fleet.sidecar.env, capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "unknown worker 'nobody'" in cli.stderr and "nothing was queued" in cli.stderr
    too_many = spec_file(tmp_path, seeds=300)
    cli = subprocess.run([*CLI, "sweep", str(too_many)], env=fleet.sidecar.env, capture_output=True, text=True,
                         timeout=60)
    assert cli.returncode == 2 and "would queue 1200 runs (4 points x 300 seeds) and max_runs is 1000" in cli.stderr
    assert fleet.runs_total() == 0


def test_an_optuna_study_on_digits_beats_the_base_graph_and_prunes_bad_trials(fleet):
    """The base: the digits MLP trained for 10 epochs with plain SGD at lr 0.002 (an untuned learning
    rate). The study searches lr on a log scale with 8 trials, two at a time, and prunes on
    val_loss_step with a median pruner. Its sampler is seeded, so the same lrs are tried every time."""
    fleet.agent("alpha")
    fleet.agent("beta")
    fixed = {"5.name": "sgd", "5.momentum": 0.0, "8.epochs": 10, "8.tensorboard": False, "8.checkpoint_every": 0,
             "10.location": "run_dir"}
    base = copy.deepcopy(DIGITS)
    for path, value in fixed.items():
        node, name = path.split(".")
        base[node]["inputs"][name] = value
    options = {"device": "cuda", "target": {"worker": "any"}}
    base_run = fleet.sidecar.finish(fleet.sidecar.submit(base, **options, name="digits base"), timeout=300)
    assert base_run["status"] == "succeeded", base_run["error"]
    base_accuracy = base_run["final_metrics"]["val_accuracy"]
    body = {"name": "digits-lr", "graph": DIGITS, "set": fixed,
            "parameters": {"5.lr": {"low": 1e-4, "high": 1.0, "log": True}}, "n_trials": 8, "parallel": 2,
            "objective": {"metric": "val_accuracy", "direction": "maximize"},
            "pruner": {"type": "median", "metric": "val_loss_step", "n_startup_trials": 2},
            "sampler": {"type": "random", "seed": 4}, "options": options}
    status, created = fleet.call("POST", "/api/studies", body)
    assert status == 200 and created["n_trials"] == 8, created
    study = fleet.wait_study(created["study_id"])
    assert study["status"] == "finished" and len(study["trials"]) == 8, study
    best = study["best_trial"]
    assert best["value"] > base_accuracy, (best, base_accuracy)
    assert best["run_status"] == "succeeded"
    assert fleet.client.run(best["run_id"])["final_metrics"]["val_accuracy"] == best["value"]
    pruned = [t for t in study["trials"] if t["state"] == "pruned"]
    assert pruned, [(t["state"], t["parameters"], t["value"]) for t in study["trials"]]
    for t in pruned:
        run = fleet.client.run(t["run_id"])
        assert t["pruned_step"] is not None and t["value"] is None
        # Stopped while it trained: fewer validations than the 10 epochs it was given. On a loaded machine
        # the pruner's answer can arrive after the run's last epoch: then the run has ended on its own,
        # and the trial is still pruned (its intermediate values decided it).
        assert run["status"] in ("cancelled", "succeeded"), run
        if run["status"] == "cancelled":
            points = fleet.client.request("GET", f"/api/runs/{t['run_id']}/events",
                                          params={"type": "metric", "limit": 1000})["events"]
            assert sum(1 for e in points if e["payload"]["name"] == "val_loss_step") < 10
    assert sum(study["counts"].values()) == 8 and study["counts"].get("complete", 0) >= 2
    for t in study["trials"]:
        assert t["worker_id"] in ("alpha", "beta") and t["devices"] == ["cuda:0"] and t["queue_key"] == "any/cuda"
    spans = [(fleet.client.run(t["run_id"])["started_at"], fleet.client.run(t["run_id"])["finished_at"])
             for t in study["trials"]]
    assert max_overlap(spans) <= 2
    trials_csv = fleet.client.request("GET", f"/api/studies/{created['study_id']}/trials.csv", raw=True).decode()
    assert len(list(csv.DictReader(io.StringIO(trials_csv)))) == 8
    shown = subprocess.run([*CLI, "studies", "show", created["study_id"][:8]], env=fleet.sidecar.env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "best so far: trial" in shown.stdout and "pruned" in shown.stdout


def all_events(client, run_id: str) -> list[dict]:
    """Every event of a run, page by page (a run that trained a while has more than one page)."""
    events, cursor = [], 0
    for _ in range(1000):
        page = client.events(run_id, cursor=cursor, limit=1000)
        events += page["events"]
        if not page["events"]:
            return events
        cursor = page["cursor"]
    raise AssertionError(f"run {run_id}: more than 1,000 pages of events")


def test_cancel_of_a_sweep_leaves_no_child_running(fleet):
    fleet.agent("alpha")
    fleet.agent("beta")
    body = load_spec(str(EXAMPLE))
    body["set"] = {"8.epochs": 100000, "8.tensorboard": False, "8.checkpoint_every": 0, "10.location": "run_dir"}
    body["options"] = {"device": "cuda", "target": {"worker": "any"}}
    status, created = fleet.call("POST", "/api/sweeps", body)
    assert status == 200 and created["n_runs"] == 4
    sweep_id = created["sweep_id"]
    fleet.wait_sweep(sweep_id, lambda s: s["counts"].get("running") == 2)
    pids = []
    for rid in created["run_ids"]:
        started = fleet.client.request("GET", f"/api/runs/{rid}/events", params={"type": "run_started"})["events"]
        pids += [e["payload"]["pid"] for e in started]
    assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids)
    cli = subprocess.run([*CLI, "sweeps", "cancel", sweep_id[:8], "--reason", "enough"], env=fleet.sidecar.env,
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0 and f"sweep {sweep_id}: cancelling" in cli.stdout, cli.stdout + cli.stderr
    sweep = fleet.wait_sweep(sweep_id, lambda s: s["status"] == "cancelled", timeout=180)
    assert sweep["counts"] == {"cancelled": 4}, sweep["counts"]
    for r in sweep["table"]:
        run = fleet.client.run(r["run_id"])
        assert run["status"] == "cancelled" and "enough" in json.dumps(all_events(fleet.client, r["run_id"]))
    for pid in pids:  # the run processes are gone, not only marked
        try:
            proc = psutil.Process(pid)
            assert proc.status() == psutil.STATUS_ZOMBIE or not proc.is_running(), proc
        except psutil.NoSuchProcess:
            pass
    for worker in ("alpha", "beta"):
        assert fleet.client.request("GET", f"/api/workers/{worker}")["runs"] == []


# --- budgets on shared cards (docs/memory.md): the same per-run admission covers them --------------------------


@pytest.fixture
def shared_card(fleet):
    """One agent whose simulated 24 GiB card is shared by memory."""
    fleet.agent("alpha", "cuda:0=24")
    status, answer = fleet.call("PUT", "/api/workers/alpha/devices/cuda:0/mode", {"mode": "shared"})
    assert status == 200, answer
    body = load_spec(str(EXAMPLE))
    body["set"] = {"8.tensorboard": False, "10.location": "run_dir"}
    return fleet, body


def test_a_sweep_whose_budget_is_larger_than_every_usable_card_is_rejected_whole(shared_card):
    fleet, body = shared_card
    status, answer = fleet.call("POST", "/api/sweeps", {**body, "options": {"target": {
        "worker": "alpha", "devices": ["cuda:0"], "memory_gib": 100}}})
    assert status == 400 and "GiB" in answer["error"] and "nothing was queued" in answer["error"], answer
    assert fleet.runs_total() == 0


def test_a_sweep_without_a_budget_for_a_graph_with_no_measured_peak_is_rejected_whole(shared_card):
    fleet, body = shared_card
    status, answer = fleet.call("POST", "/api/sweeps", {**body, "options": {"target": {
        "worker": "alpha", "devices": ["cuda:0"]}}})
    assert status == 400 and "budget" in answer["error"] and "nothing was queued" in answer["error"], answer
    study = {k: v for k, v in body.items() if k != "mode"} | {
        "parameters": {"5.lr": {"low": 1e-4, "high": 0.1, "log": True}}, "n_trials": 4,
        "options": {"target": {"worker": "alpha", "devices": ["cuda:0"]}}}
    status, answer = fleet.call("POST", "/api/studies", study)
    assert status == 400 and "budget" in answer["error"] and answer["error"].startswith("the study's runs"), answer
    assert fleet.runs_total() == 0 and fleet.client.request("GET", "/api/studies")["total"] == 0


def test_a_sweep_with_wait_false_that_does_not_fit_now_names_the_free_memory(shared_card):
    fleet, body = shared_card
    from xpufleet.server.devices import set_simulated_free

    set_simulated_free(fleet.home, "alpha", "cuda:0", 2.0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the next heartbeat carries it (no push channel to the test)
        card = next(d for d in fleet.client.request("GET", "/api/workers/alpha")["devices"] if d["name"] == "cuda:0")
        if card["free_gib"] == 2.0:
            break
        time.sleep(0.2)
    status, answer = fleet.call("POST", "/api/sweeps", {**body, "options": {"target": {
        "worker": "alpha", "devices": ["cuda:0"], "memory_gib": 4, "wait": False}}})
    assert status == 400 and "free" in answer["error"] and "not available yet" not in answer["error"], answer
    assert fleet.runs_total() == 0

