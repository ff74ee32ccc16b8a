"""Restart: kill -9 the sidecar with runs executing and queued; `xpufleet start` again.

Queued runs stay queued and then run; runs that were executing end ``interrupted`` with a reason;
finished runs and their event logs are untouched (docs/sidecar.md: nothing is lost on a restart).
"""

from __future__ import annotations

import psutil
import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

pytestmark = pytest.mark.e2e


def test_kill_9_then_start_keeps_queued_runs_and_interrupts_executing_ones(tmp_path):
    sc = harness.Sidecar(tmp_path / "home").start()
    try:
        done = sc.submit(harness.iris_graph(1), name="finished-before")
        assert sc.finish(done)["status"] == "succeeded"
        done_events = sc.client.events(done, limit=1000)["events"]
        a = sc.submit(harness.iris_graph(10**6), name="executing-a")
        b = sc.submit(harness.iris_graph(10**6), name="executing-b")
        queued = sc.submit(harness.iris_graph(1), name="queued-q")
        sc.wait_for(a, "progress")
        sc.wait_for(b, "progress")
        assert sc.client.run(queued)["status"] == "queued"
        children = {r: sc.client.run(r)["execution_facts"].get("pid") for r in (a, b)}
        old_pid = sc.pid

        sc.kill9()
        assert not psutil.pid_exists(old_pid) or psutil.Process(old_pid).status() == psutil.STATUS_ZOMBIE
        proc = sc.cli("status")
        assert proc.returncode == 3  # the runtime file is stale: nobody answers

        sc.start()
        assert sc.pid != old_pid
        c = sc.client
        for rid in (a, b):
            run = sc.finish(rid)
            assert run["status"] == "interrupted", run
            assert run["error"] and ("went away" in run["error"] or "server stopped" in run["error"])
            events = c.events(rid, limit=1000)["events"]
            assert [e["cursor"] for e in events] == list(range(1, len(events) + 1))
            assert [e["type"] for e in events].count("run_finished") == 1
        for pid in children.values():  # the orphaned run processes are gone, not left running
            if pid:
                assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        after = sc.finish(queued)
        assert after["status"] == "succeeded" and after["name"] == "queued-q"
        again = c.run(done)
        assert again["status"] == "succeeded"
        assert c.events(done, limit=1000)["events"] == done_events
        statuses = {r["id"]: r["status"] for r in c.runs(limit=10)["runs"]}
        assert statuses == {done: "succeeded", a: "interrupted", b: "interrupted", queued: "succeeded"}
    finally:
        sc.stop()


def test_graceful_stop_interrupts_started_runs_and_keeps_queued_ones(tmp_path):
    sc = harness.Sidecar(tmp_path / "home").start()
    try:
        a = sc.submit(harness.iris_graph(10**6), name="executing")
        b = sc.submit(harness.iris_graph(10**6), name="executing-2")
        queued = sc.submit(harness.iris_graph(1), name="waits")
        sc.wait_for(a, "progress")
        sc.wait_for(b, "progress")
        proc = sc.cli("stop", check=True)
        assert "stopped" in proc.stdout
        assert not (sc.home / "runtime.json").exists()
        sc.info = None
        sc.start()
        run = sc.client.run(a)
        assert run["status"] == "interrupted"
        assert run["error"] == "the server was stopped while this run was executing"
        events = sc.client.events(a, limit=1000)["events"]
        ckpt = [e for e in events if e["type"] == "artifact" and e["payload"].get("reason") == "interrupt"]
        assert ckpt, "a graceful stop lets TrainingLoop write its interrupt checkpoint"
        assert sc.finish(queued)["status"] == "succeeded"
    finally:
        sc.stop()
