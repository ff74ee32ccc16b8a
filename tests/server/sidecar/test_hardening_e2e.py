"""Issue 9, end to end: each reproduction of the black-box probe against a real sidecar (and a real
worker agent) on loopback, with the answer it gets now. The limits are those of constants.py.

The issue asks for a refusal within 1 s with health checks answered meanwhile. Seconds alone are a
figure the machine's load decides (under load the refusal once took 1.15 s and failed CI, issue 19), so
each bound here is against a baseline measured in the same test: a refusal may take the larger of 1 s and
``REFUSAL_FACTOR`` times the refusal of the same body for a cheap reason (read, decoded and shape-checked,
never validated), and a health check at most ``harness.health_bound`` of its own unloaded median. The
bug was a hang of 15 minutes (and 29 to 81 s stalls): far beyond either. bench/bench_validate.py
measures the validation's time.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import psutil
import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.constants import MAX_GRAPH_ERRORS_LISTED

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

HEARTBEAT_S = "1"  # Degraded after 3 s without one
REFUSAL_BOUND_S = 1.0  # the issue: "the refusal arrives within 1 s" (on a quiet machine)
REFUSAL_FACTOR = 10.0  # ... or this multiple of the same body's cheap refusal, measured in the same test


def refusal_bound(api: harness.Api, graph: dict[str, Any]) -> float:
    """How long the refusal of ``graph`` may take: see the module docstring (best of 3 cheap refusals:
    the same body with an unknown option, refused after the shape check, before validation)."""
    body = json.dumps({"graph": graph, "options": {"no_such_option": 1}}).encode()
    cheap = []
    for _ in range(3):
        status, answer, took = api.call("POST", "/api/runs", body)
        assert status == 400 and "no_such_option" in answer["error"], answer
        cheap.append(took)
    return max(REFUSAL_BOUND_S, REFUSAL_FACTOR * min(cheap))


ring = harness.loops_ring


def losses(n: int) -> dict[str, Any]:
    """The probe's stall: n XPULoss nodes and no output node."""
    return {str(i): {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}} for i in range(n)}


def saver_graph(filename: str) -> dict[str, Any]:
    g = harness.iris_graph(1)
    g["9"] = {"class_type": "XPUModelSaver", "inputs": {"model": ["7", 0], "filename": filename,
                                                        "format": "safetensors", "location": "outputs"}}
    return g


def wait_worker(api: harness.Api, name: str, status: str, timeout: float = 60.0) -> dict[str, Any]:
    def online() -> dict[str, Any] | None:
        code, w, _ = api.call("GET", f"/api/workers/{name}")
        return w if code == 200 and w["status"] == status else None

    return harness.wait_until(online, f"worker {name} {status}", timeout)


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    sc = harness.Sidecar(tmp_path_factory.mktemp("harden-home"),
                         env={"XPUFLEET_HEARTBEAT_INTERVAL_S": HEARTBEAT_S}).start()
    yield sc
    sc.stop()


@pytest.fixture(scope="module")
def worker(sidecar):
    """One agent on this machine (CPU), heartbeating every second."""
    agent = harness.AgentProcess(sidecar, "hb")
    wait_worker(harness.Api(sidecar), "hb", "Online")
    yield agent
    agent.stop()


# --- 1, 2: a hang and event-loop stalls ---------------------------------------------------------------


def test_the_probes_9995_node_cycle_is_refused_within_1s_while_health_answers(sidecar):
    api = harness.Api(sidecar)
    body = json.dumps({"graph": ring(9995)}).encode()
    assert len(body) > 400_000  # (the probe's graph was 2.3 MB with its other inputs)
    bound, health_bound = refusal_bound(api, ring(9995)), harness.health_bound(harness.unloaded_health(api))
    health = harness.Sampler(lambda: api.call("GET", "/api/health", timeout=10)[2])
    health.start()
    try:
        status, answer, took = api.call("POST", "/api/runs", body)
    finally:
        samples = health.stop()
    assert status == 400, answer
    assert took < bound, f"refused after {took:.2f} s, bound {bound:.2f} s (was a hang of over 15 minutes)"
    info = answer["validation"]["error"]["extra_info"]
    assert info == {"errors_total": 9995 * 8, "errors_listed": MAX_GRAPH_ERRORS_LISTED}
    assert sum(len(e["errors"]) for e in answer["node_errors"].values()) == MAX_GRAPH_ERRORS_LISTED
    assert len(json.dumps(answer)) < 200_000  # 1,000 nodes used to answer 49 MB
    assert samples and all(isinstance(t, float) and t < health_bound for _, t in samples), (health_bound, samples)


def test_10000_nodes_without_an_output_are_refused_within_1s(sidecar):
    bound = refusal_bound(harness.Api(sidecar), losses(10_000))
    status, answer, took = harness.Api(sidecar).post("/api/runs", {"graph": losses(10_000)})
    assert status == 400 and answer["validation"]["error"]["type"] == "prompt_no_outputs", answer
    assert took < bound, f"refused after {took:.2f} s, bound {bound:.2f} s (was 29 to 81 s)"
    status, answer, _ = harness.Api(sidecar).post("/api/runs", {"graph": losses(10_001)})
    assert status == 413 and answer["error"] == "graph: 10001 nodes; a graph has at most 10000 (the limit)"


def test_a_10000_node_graph_while_an_agent_heartbeats_and_a_run_trains(sidecar, worker):
    """The stall's victim: a worker whose connection dropped during a stall, and its healthy run
    interrupted after the resume grace. Now the agent stays Online and the run succeeds."""
    api = harness.Api(sidecar)
    # batches of 1 for 5,000 epochs: it trains until this test stops it, however long the requests take
    training = harness.iris_graph(5000)
    training["2"]["inputs"]["batch_size"] = 1
    run_id = sidecar.submit(training, target="hb", name="keeps-training")
    sidecar.wait_for(run_id, "progress", 120)  # it trains on the worker
    bound = refusal_bound(api, ring(10_000))
    status_of = harness.Sampler(lambda: api.call("GET", "/api/workers/hb", timeout=10)[1]["status"])
    status_of.start()
    refusals = []
    first_sent = time.time()
    try:
        for graph in (ring(10_000), losses(10_000), ring(10_000)):
            status, answer, took = api.post("/api/runs", {"graph": graph})
            assert status == 400, answer
            refusals.append(took)
    finally:
        statuses = status_of.stop()
    assert max(refusals) < bound, (bound, refusals)
    assert statuses and {s for s, _ in statuses} == {"Online"}, statuses  # never Degraded nor Disconnected
    status, run, _ = api.call("GET", f"/api/runs/{run_id}")
    assert status == 200 and run["status"] == "running" and run["worker_id"] == "hb", run  # trained throughout
    assert run["started_at"] < first_sent
    assert api.call("POST", f"/api/runs/{run_id}/cancel")[0] == 200
    run = sidecar.finish(run_id, 300)
    assert run["status"] == "cancelled" and "interrupted" not in str(run["error"]), run  # stopped by us alone
    assert worker.text().count("connected to") == 1  # the agent never lost its connection


# --- 3: 500s ------------------------------------------------------------------------------------------


def test_deep_json_surrogates_and_long_names_get_400s_without_server_paths(sidecar):
    api = harness.Api(sidecar)
    deep = b'{"graph":{"1":{"class_type":"XPULoss","inputs":{"name":' + b"[" * 1000 + b"]" * 1000 + b"}}}}"
    for path in ("/api/runs", "/api/predict"):
        body = deep if path == "/api/runs" else deep.replace(b'"graph"', b'"workflow"')
        status, answer, _ = api.call("POST", path, body)
        assert status == 400 and "more than 64 levels deep (the limit)" in answer["error"], answer
    status, answer, _ = api.call("POST", "/api/runs", b'{"graph":{"1":{"class_type":"XPULoss","inputs":{}}},'
                                                      b'"options":{"name":"\\ud800x"}}')
    assert status == 400 and answer["error"].startswith("options.name: holds a lone UTF-16 surrogate")
    status, answer, _ = api.call("POST", "/api/runs", b'{"graph":{"1":{"class_type":"XPULoss",'
                                                      b'"inputs":{"\\ud800":1}}}}')
    assert status == 400 and answer["error"].startswith("a key of graph.1.inputs")
    status, answer, _ = api.post("/api/runs", {"graph": harness.iris_graph(1), "options": {"name": "n" * 5000}})
    assert status == 400 and answer["error"] == "options.name: 5000 characters; at most 200"
    run_id = sidecar.submit(harness.iris_graph(1), name="has-files")
    sidecar.finish(run_id)
    status, answer, _ = api.call("GET", f"/api/runs/{run_id}/artifacts/{'a' * 5000}")
    assert status == 400 and "has 5000 characters; a path has at most 1024" in answer["error"]
    status, answer, _ = api.call("GET", f"/api/runs/{run_id}/artifacts/{'a' * 300}.pt")
    assert status == 400 and "a name of 303 bytes" in answer["error"]
    assert str(sidecar.home) not in json.dumps(answer)  # never the server's path


# --- 4: files outside the outputs folder --------------------------------------------------------------


def test_model_saver_cannot_write_outside_its_folder_on_the_sidecar_or_a_worker(sidecar, worker, tmp_path):
    api = harness.Api(sidecar)
    escape = sidecar.home.parent / "x.safetensors"
    for filename in ("../../../x.safetensors", "../x.safetensors", str(tmp_path / "abs.safetensors")):
        status, answer, _ = api.post("/api/runs", {"graph": saver_graph(filename)})
        assert status == 400, answer  # refused before anything runs, naming the input and the folder
        (err,) = answer["node_errors"]["9"]["errors"]
        assert err["type"] == "custom_validation_failed" and "filename" in err["message"]
        assert "files go inside the outputs folder or the run directory" in err["message"]
    # On a worker the same node code refuses it (the worker's run validates the graph)
    run_id = sidecar.submit(saver_graph("../x.safetensors"), target="hb")
    run = sidecar.finish(run_id, 120)
    assert run["status"] == "failed" and "climbs out of its folder with '..'" in run["error"], run
    # ... and a symlink inside the outputs folder that leads out is refused when the node saves
    outside = tmp_path / "outside"
    outside.mkdir()
    (sidecar.home / "outputs").mkdir(exist_ok=True)
    (sidecar.home / "outputs" / "evil").symlink_to(outside, target_is_directory=True)
    for target in ("local", "hb"):
        run_id = sidecar.submit(saver_graph("evil/m.safetensors"), target=target)
        run = sidecar.finish(run_id, 120)
        assert run["status"] == "failed" and "leads outside the outputs folder" in run["error"], run
    assert not escape.exists() and not (tmp_path / "abs.safetensors").exists() and list(outside.iterdir()) == []
    run_id = sidecar.submit(saver_graph("models/inside.safetensors"), target="hb")
    assert sidecar.finish(run_id, 120)["status"] == "succeeded"
    assert (sidecar.home / "outputs" / "models" / "inside.safetensors").is_file()  # the agent shares this home


# --- 6: a slot reused before its run's process has exited -------------------------------------------


def live_group(pgid: int) -> list[int]:
    """Processes (zombies aside: they have exited) of process group ``pgid``."""
    out = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getpgid(p.pid) == pgid and p.info["status"] != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return out


def test_a_run_with_dataloader_workers_succeeds(sidecar):
    """DataLoader num_workers > 0 used to hang every queued run (the runner's stdin watcher held
    sys.stdin's lock across the workers' fork)."""
    g = harness.iris_graph(2)
    g["2"]["inputs"]["num_workers"] = 2
    run = sidecar.finish(sidecar.submit(g, name="with-workers"), 120)
    assert run["status"] == "succeeded", run


def test_a_run_is_finished_only_when_every_process_of_it_has_exited(sidecar):
    """The probe: a run showed succeeded while its process kept working for up to ~4 s (Python's
    and torch's teardown, DataLoader workers), so two CPU slots ran up to four run processes."""
    g = harness.iris_graph(2)
    g["2"]["inputs"]["num_workers"] = 2  # worker processes in the run's process group
    run_id = sidecar.submit(g, name="process-gone")
    pid = sidecar.wait_for(run_id, "run_started", 60)["payload"]["pid"]
    sidecar.wait_for(run_id, "run_finished", 120)
    left = live_group(pid)  # at once: the run is reported finished
    assert sidecar.client.run(run_id)["status"] == "succeeded"
    assert left == [], f"processes of run {run_id} still running when it was reported finished: {left}"
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


# --- 7, 8: the CLI ----------------------------------------------------------------------------------


def test_a_run_name_with_terminal_escapes_is_printed_escaped(sidecar):
    name = "\x1b[2J\x1b[31mFAKE succeeded"
    run_id = sidecar.submit(harness.iris_graph(1), name=name)
    sidecar.finish(run_id)
    out = sidecar.cli("runs", "--name", "FAKE", check=True).stdout
    assert "\x1b" not in out and "\\x1b[2J\\x1b[31mFAKE succeeded" in out
    assert json.loads(sidecar.cli("runs", "--json", "--name", "FAKE", check=True).stdout)["runs"][0]["name"] == name


def test_validation_errors_are_printed_once(sidecar, tmp_path):
    bad = harness.iris_graph(1)
    bad["7"]["inputs"]["epochs"] = 0
    del bad["8"]["inputs"]["dataloader"]
    proc = sidecar.cli("run", str(harness.write_graph(tmp_path / "bad.json", bad)))
    assert proc.returncode == 2, proc.stderr
    for fragment in ("Value 0 smaller than min of 1: input 'epochs' of node 7 (XPUTrainingLoop)",
                     "Required input is missing: 'dataloader' of node 8 (XPUEvaluate)"):
        assert proc.stderr.count(fragment) == 1, proc.stderr
