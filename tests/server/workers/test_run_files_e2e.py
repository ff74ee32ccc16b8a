"""End to end: a worker run's output log (live, while it trains) and its files (listed and downloaded)
read through the sidecar from the agent that ran it, while the worker is connected; plainly refused once
it is not (docs/runs-panel.md). Real sidecar, real agent, real runs (iris)."""

from __future__ import annotations

import time

import fleet_harness as fh
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(420)]


def _wait_log(sc: fh.SidecarProc, run_id: str, timeout: float = 120.0) -> dict:
    """The run's log once it holds text, while the run is still running (bounded: events long-polled)."""
    deadline = time.monotonic() + timeout
    cursor = 0
    while time.monotonic() < deadline:
        log = sc.ok("GET", f"/api/runs/{run_id}/logs?tail=65536")
        if log["text"]:
            return log
        cursor = sc.ok("GET", f"/api/runs/{run_id}/events?cursor={cursor}&wait=2")["cursor"]
    raise AssertionError(f"run {run_id} wrote no log in {timeout} s: {sc.run(run_id)}")


def test_a_worker_runs_log_and_files_come_through_its_agent(fleet):
    sc = fleet.sidecar()
    agent = fleet.agent("--name", "keeper")
    agent.wait_connected()
    # live: a run that trains until stopped, its log read while it runs
    endless = sc.submit(fh.iris_graph(10**6), target="keeper", name="endless")
    sc.wait_run(endless, {"running"})
    live = _wait_log(sc, endless)
    assert sc.run(endless)["status"] == "running"
    assert live["where"] == "worker" and live["worker"] == "keeper" and live["connected"] is True
    on_disk = (fleet.home / "agents" / "keeper" / "runs" / endless / "output.log").read_bytes()
    assert live["offset"] == max(0, live["size"] - 65536) and live["size"] <= len(on_disk)
    assert on_disk[live["offset"]:live["next_offset"]] == live["text"].encode()  # the worker's own bytes
    more = sc.ok("GET", f"/api/runs/{endless}/logs?offset={live['next_offset']}")
    assert more["offset"] == live["next_offset"]  # the next read goes on where the last stopped
    sc.ok("POST", f"/api/runs/{endless}/cancel", {})
    sc.wait_run(endless, {"cancelled"})

    # finished: its files listed by the agent and downloaded through the sidecar
    done = sc.submit(fh.iris_graph(), target="keeper", name="done")
    run = sc.wait_run(done, {"succeeded", "failed"})
    assert run["status"] == "succeeded", run["error"]
    folder = fleet.home / "agents" / "keeper" / "runs" / done
    arts = sc.ok("GET", f"/api/runs/{done}/artifacts")
    assert arts["where"] == "worker" and arts["connected"] is True and arts["location"] == "on worker keeper"
    listed = {a["path"]: a for a in arts["artifacts"] if a["downloadable"]}
    on_worker = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and not p.is_symlink()}
    assert "output.log" in listed and "spec.json" in listed and set(listed) <= on_worker
    assert listed["output.log"]["kind"] == "log" and listed["spec.json"]["kind"] == "spec"
    for path in ("spec.json", "output.log"):
        code, body = sc.call("GET", f"/api/runs/{done}/artifacts/{path}", raw=True)
        assert code == 200 and body == (folder / path).read_bytes(), path
        assert listed[path]["size"] == len(body)
    code, body = sc.call("GET", f"/api/runs/{done}/artifacts/no-such-file")
    assert code == 404 and "on worker keeper" in body["error"]
    code, body = sc.call("GET", f"/api/runs/{done}/artifacts/..%2F{endless}%2Foutput.log")
    assert code == 400 and ".." in body["error"]
    log = sc.ok("GET", f"/api/runs/{done}/logs")
    assert log["text"].encode() == (folder / "output.log").read_bytes() and log["connected"] is True

    # the worker away: said plainly, nothing pretends
    agent.stop()
    sc.wait_worker("keeper", "Disconnected")
    log = sc.ok("GET", f"/api/runs/{done}/logs")
    assert log["connected"] is False and log["text"] == "" and "worker keeper is not connected now" in log["message"]
    arts = sc.ok("GET", f"/api/runs/{done}/artifacts")
    assert arts["connected"] is False and not any(a["downloadable"] for a in arts["artifacts"])
    code, body = sc.call("GET", f"/api/runs/{done}/artifacts/spec.json")
    assert code == 409 and "worker keeper is not connected now" in body["error"]
