"""End to end against the real test Slurm (../shared/slurm/; docs/slurm-and-k8s.md): a real sidecar submits
real jobs whose one-shot agents join its pool with the cards Slurm gave them (simulated here).

* 5 runs, --max-jobs 2: squeue (sampled) never lists more than 2 jobs, every run succeeds, every job ends,
  no instance is left;
* a waiting run cancelled: its pending job is cancelled within 5 s (a bound only a bug crosses);
* a bad python path: the job's Slurm state and output lines are shown, it is retried, then the run fails
  with that reason;
* kill -9 of the sidecar while jobs pend, then a restart: no duplicate job, no orphan;
* the credential is in no `squeue -o %all`, `scontrol show job` or `ps` output.
"""

from __future__ import annotations

import statistics
import subprocess
import time

import fleet_harness as fh
import pytest
import slurm_harness as sh

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]
TERMINAL = {"succeeded", "failed", "cancelled", "interrupted"}


@pytest.fixture(autouse=True)
def _cluster():
    sh.require_slurm()
    yield
    for name in _NAMES:  # a failed test's jobs must not hold the cards for the next one
        subprocess.run(["scancel", f"--name={name}"], capture_output=True, timeout=30)
    _NAMES.clear()


_NAMES: list[str] = []


def _pool(sc: fh.SidecarProc, name: str) -> dict:
    pool = sc.ok("GET", f"/api/pools/{name}")
    if pool.get("slurm") and pool["slurm"]["job_name"] not in _NAMES:
        _NAMES.append(pool["slurm"]["job_name"])
    return pool


def _no_live_jobs(job_name: str) -> bool:
    return not sh.jobs(job_name)


def test_five_runs_with_max_jobs_2_never_exceed_two_jobs_and_all_end(fleet):
    sc = fleet.sidecar()
    created = fleet.cli("pools", "create", "sl5", "--slurm", "--max-jobs", "2", "--python", fh.sys.executable,
                        "--simulate-gib", "8", "--idle-exit", "5", "--time-limit", "10")
    assert created.returncode == 0, created.stderr
    pool = _pool(sc, "sl5")
    assert pool["kind"] == "slurm" and pool["slurm"]["max_jobs"] == 2
    name = pool["slurm"]["job_name"]
    sampler = sh.Sampler(name)
    sampler.start()
    t0 = time.monotonic()
    runs = [sc.submit(fh.iris_graph(), target={"pool": "sl5"}) for _ in range(5)]
    try:
        done = [sc.wait_run(r, TERMINAL, timeout=400) for r in runs]
        sh.wait_for(lambda: _no_live_jobs(name), "every job ended", timeout=90)
    finally:
        sampler.stop()
    print(f"5 runs through Slurm pool: {time.monotonic() - t0:.1f} s, load {open('/proc/loadavg').read().split()[:3]}")
    assert [r["status"] for r in done] == ["succeeded"] * 5, [r["error"] for r in done]
    assert sampler.samples > 20 and sampler.most <= 2, (sampler.most, sampler.samples)
    assert sampler.most == 2  # it did scale out to max-jobs
    assert all(r["worker_id"].startswith("sl5-slurm") for r in done)
    ended = sh.jobs(name, all_states=True)
    assert ended and all(state == "COMPLETED" for _, state in ended), ended
    sh.wait_for(lambda: not (p := _pool(sc, "sl5"))["instances"] and all(j["ended_at"] for j in p["jobs"]),
                "no instance left, every job's end recorded", 60)
    pool = _pool(sc, "sl5")
    assert all(j["state"] == "COMPLETED" and j["joined"] for j in pool["jobs"]), pool["jobs"]
    listed = fleet.cli("pools")
    assert listed.returncode == 0 and "sl5 [slurm]" in listed.stdout and "Slurm job" in listed.stdout, listed.stdout


def test_cancelling_a_waiting_run_cancels_its_pending_job_within_5_s(fleet):
    sc = fleet.sidecar()
    sc.ok("POST", "/api/pools", sh.pool_body("slc"), 201)
    name = _pool(sc, "slc")["slurm"]["job_name"]
    blocker = sh.Blocker()
    try:
        run = sc.submit(fh.iris_graph(), target={"pool": "slc"})
        waiting = sc.wait_reason(run, "PENDING (Resources)", timeout=60)
        job_id = waiting["waiting_reason"].split("Slurm job ")[1].split(":")[0]
        assert waiting["waiting_reason"] == f"waiting for Slurm job {job_id}: PENDING (Resources)"
        workers = sc.ok("GET", "/api/workers")
        (listed,) = [p for p in workers["pools"] if p["name"] == "slc"]
        assert [(j["id"], j["status"]) for j in listed["jobs"]] == [(job_id, "PENDING (Resources)")]
        t0 = time.monotonic()
        sc.ok("POST", f"/api/runs/{run}/cancel")
        sh.wait_for(lambda: job_id not in {i for i, _ in sh.jobs(name)}, "the pending job cancelled", timeout=5,
                    every=0.1)
        print(f"pending job cancelled {time.monotonic() - t0:.2f} s after its run")
        assert dict(sh.jobs(name, all_states=True))[job_id] == "CANCELLED"
        time.sleep(2)  # nothing is submitted again for the cancelled run
        assert _no_live_jobs(name)
        # reissue: the jobs' credential file follows; export uses it as it is (no reissue)
        cred_file = fleet.home / "slurm" / "slc" / "credential"
        new = sc.ok("POST", "/api/pools/slc/reissue")["credential"]
        assert cred_file.read_text().strip() == new and oct(cred_file.stat().st_mode & 0o777) == "0o600"
        exported = sc.ok("POST", "/api/pools/slc/export", {"format": "k8s"})
        assert exported["reissued"] is False and f"credential: {new}" in exported["manifests"]
        # remove: the waiting run fails, its pending job is cancelled, the credential file is gone
        second = sc.submit(fh.iris_graph(), target={"pool": "slc"})
        sc.wait_reason(second, "PENDING (Resources)", timeout=60)
        removed = fleet.cli("pools", "remove", "slc")
        assert removed.returncode == 0 and "1 waiting run(s) failed" in removed.stdout, removed.stdout
        assert sc.run(second)["status"] == "failed"
        sh.wait_for(lambda: _no_live_jobs(name), "the removed pool's job cancelled", timeout=10)
        assert not cred_file.exists()
    finally:
        blocker.release()


def test_a_job_that_cannot_join_is_reported_retried_then_fails_its_run(fleet):
    sc = fleet.sidecar()
    sc.ok("POST", "/api/pools", sh.pool_body("slbad", python="/nonexistent/xpufleet-python", retries=1), 201)
    _pool(sc, "slbad")
    run = sc.submit(fh.iris_graph(), target={"pool": "slbad"})
    retrying = sc.wait_reason(run, "ended without joining", timeout=60)
    assert "FAILED" in retrying["waiting_reason"] and "/nonexistent/xpufleet-python" in retrying["waiting_reason"]
    assert "attempt 2 of 2" in retrying["waiting_reason"]
    done = sc.wait_run(run, TERMINAL, timeout=120)
    assert done["status"] == "failed"
    assert "ended without joining pool slbad: FAILED" in done["error"], done["error"]
    assert "/nonexistent/xpufleet-python" in done["error"] and "after 2 attempt(s)" in done["error"]
    jobs = _pool(sc, "slbad")["jobs"]
    assert len(jobs) == 2 and all(j["state"] == "FAILED" and not j["joined"] for j in jobs), jobs
    assert all("No such file" in j["report"] for j in jobs), jobs
    listed = fleet.cli("pools")
    assert "ended without joining" in listed.stdout, listed.stdout


def test_kill_9_of_the_sidecar_while_jobs_pend_submits_nothing_twice(fleet):
    sc = fleet.sidecar()
    sc.ok("POST", "/api/pools", sh.pool_body("slk", max_jobs=3), 201)
    name = _pool(sc, "slk")["slurm"]["job_name"]
    blocker = sh.Blocker()
    try:
        runs = [sc.submit(fh.iris_graph(), target={"pool": "slk"}) for _ in range(3)]
        for r in runs:
            sc.wait_reason(r, "PENDING (", timeout=60)  # Resources, or Priority behind the first
        before = sorted(i for i, _ in sh.jobs(name))
        assert len(before) == 3
        # a job the dead sidecar submitted but never recorded: the next one adopts it (no orphan)
        stray = sh.slurm("sbatch", "--parsable", f"--job-name={name}", "--gres=gpu:1", "--output=/dev/null",
                         "--wrap", "sleep 1").strip()
        fh.kill9(sc.proc.pid)
        sc.proc.wait(30)
        sc.start()
        time.sleep(3)  # a few ticks of the new sidecar: it must not submit again
        after = sorted(i for i, _ in sh.jobs(name))
        assert set(after) <= set(before) | {stray}, (before, after)
        jobs = _pool(sc, "slk")["jobs"]
        assert {j["id"] for j in jobs} >= set(before) | {stray}
        live = [j for j in jobs if j["state"] == "PENDING"]
        assert len(live) <= 3 and all(j["run_id"] in runs for j in live), live  # every pending job has a run
    finally:
        blocker.release()
    done = [sc.wait_run(r, TERMINAL, timeout=300) for r in runs]
    assert [r["status"] for r in done] == ["succeeded"] * 3, [r["error"] for r in done]
    sh.wait_for(lambda: _no_live_jobs(name), "every job ended", timeout=90)
    seen = {i for i, _ in sh.jobs(name, all_states=True)}
    assert seen <= set(before) | {stray}, (before, seen)  # nothing was submitted twice


def test_the_credential_is_in_no_squeue_scontrol_or_ps_output(fleet):
    sc = fleet.sidecar()
    created = sc.ok("POST", "/api/pools", sh.pool_body("slsec"), 201)
    secret = created["credential"]
    _pool(sc, "slsec")
    blocker = sh.Blocker()
    try:
        pending = sc.submit(fh.iris_graph(), target={"pool": "slsec"})
        sc.wait_reason(pending, "PENDING (Resources)", timeout=60)
        outputs = [sh.slurm("squeue", "-o", "%all"), sh.slurm("scontrol", "show", "job", "-dd")]
    finally:
        blocker.release()
    run = sc.wait_run(pending, TERMINAL, timeout=180)
    assert run["status"] == "succeeded", run["error"]
    outputs.append(subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, timeout=30).stdout)
    assert len(outputs[0].splitlines()) >= 2 and "JobId=" in outputs[1]
    assert not any(secret in text for text in outputs)
    assert not any(secret[4:20] in text for text in outputs)
    # an instance that joined and takes no run is told to leave after idle_exit_s (5 s here)
    idle = fleet.agent("--one-shot", "--join", secret, label="idle")
    idle.wait_connected()
    idle.out.wait_for("idle for 5 s (Slurm pool slsec's idle_exit_s)", timeout=60)
    assert idle.wait_exit(60) == 0


def test_submit_to_first_node_finished_through_a_slurm_pool_p50_of_5(fleet):
    """The figure in README.md: from POST /api/runs to the first node_finished event, each run alone."""
    sc = fleet.sidecar()
    sc.ok("POST", "/api/pools", sh.pool_body("slt"), 201)
    _pool(sc, "slt")
    times = []
    for _ in range(5):
        t0 = time.monotonic()
        run = sc.submit(fh.iris_graph(), target={"pool": "slt"})
        cursor = 0
        while True:
            body = sc.ok("GET", f"/api/runs/{run}/events?cursor={cursor}&wait=5")
            cursor = body["cursor"]
            if any(e.get("type") == "node_finished" for e in body["events"]):
                times.append(time.monotonic() - t0)
                break
            assert body["status"] not in TERMINAL, sc.run(run)
        assert sc.wait_run(run, TERMINAL)["status"] == "succeeded"
    load = open("/proc/loadavg").read().split()[:3]
    print(f"submit -> first node_finished through Slurm: p50 {statistics.median(times):.2f} s "
          f"({', '.join(f'{t:.2f}' for t in times)}), load average {' '.join(load)}")
    assert len(times) == 5


def test_a_ddp_run_gets_its_whole_device_set_in_one_job_through_a_tls_sidecar(fleet):
    """Both cards in one job (--gres=gpu:2), the agent pinned to the sidecar's certificate fingerprint."""
    sc = fleet.sidecar("--tls")
    assert sc.url.startswith("https://") and sc.fingerprint
    sc.ok("POST", "/api/pools", sh.pool_body("slddp"), 201)
    name = _pool(sc, "slddp")["slurm"]["job_name"]
    graph = fh.iris_graph()
    graph["8"]["inputs"]["strategy"] = "ddp"
    run = sc.submit(graph, target={"pool": "slddp", "devices": ["cuda:0", "cuda:1"]})
    done = sc.wait_run(run, TERMINAL, timeout=300)
    assert done["status"] == "succeeded", done["error"]
    assert done["devices"] == ["cuda:0", "cuda:1"] and done["execution_facts"].get("strategy") == "ddp", done
    (job,) = _pool(sc, "slddp")["jobs"]
    assert job["cards"] == 2 and job["joined"]
    server_file = (fleet.home / "slurm" / "slddp" / "server").read_text().splitlines()
    assert server_file == [sc.url, sc.fingerprint]
    sh.wait_for(lambda: _no_live_jobs(name), "the job ended", timeout=90)
