"""The /xpufleet/ routes of a real ComfyUI reaching a real sidecar (docs/comfyui.md): a clear 503 without one;
a run queued, followed and read back through ComfyUI with the token kept server side; and
POST /xpufleet/sidecar/start starting one from ComfyUI's own interpreter."""

from __future__ import annotations

import json
import time
from typing import Any

import psutil
import pytest
import sidecar_harness as harness  # registered by tests/comfy_host/conftest.py

from xpufleet.common.client import Client
from xpufleet.common.runtime_file import pid_alive, read_runtime

pytestmark = pytest.mark.comfy


def follow(comfyui, run_id: str, timeout: float = 120.0) -> list[dict[str, Any]]:
    """Every event of the run, long-polled through ComfyUI until the run is done (bounded)."""
    events: list[dict[str, Any]] = []
    cursor, deadline = 0, time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, page = comfyui.request("GET", f"/xpufleet/api/runs/{run_id}/events?cursor={cursor}&wait=10",
                                     timeout=30)
        assert code == 200, page
        events += page["events"]
        cursor = page["cursor"]
        if page["done"]:
            return events
    raise AssertionError(f"run {run_id} did not finish within {timeout} s: {events[-3:]}")


def queue_and_read_back(comfyui, sc: harness.Sidecar, name: str) -> dict[str, Any]:
    code, queued = comfyui.request("POST", "/xpufleet/api/runs",
                                   {"graph": harness.iris_graph(epochs=2), "options": {"name": name}})
    assert code == 201, queued
    run_id = queued["run_id"]
    events = follow(comfyui, run_id)
    assert events[-1]["type"] == "run_finished" and any(e["type"] == "metric" for e in events)
    run = comfyui.get(f"/xpufleet/api/runs/{run_id}")
    assert run["status"] == "succeeded" and run["name"] == name, run
    assert sc.client.run(run_id)["status"] == "succeeded"  # the same run, asked directly
    assert run_id in [r["id"] for r in comfyui.get("/xpufleet/api/runs")["runs"]]
    return run


def test_a_run_through_comfyui_on_a_sidecar_started_by_the_test(comfyui):
    status = comfyui.get("/xpufleet/sidecar")
    assert status["running"] is False and status["home"] == str(comfyui.home)
    code, body = comfyui.request("GET", "/xpufleet/api/runs")
    assert code == 503 and "xpufleet start" in body["error"] and str(comfyui.home) in body["error"]
    sc = harness.Sidecar(comfyui.home).start()
    try:
        status = comfyui.get("/xpufleet/sidecar")
        assert status["running"] is True and status["url"] == sc.url and status["pid"] == sc.pid
        run = queue_and_read_back(comfyui, sc, "via-comfyui")
        assert run["final_metrics"]["val_accuracy"] > 0.5
        workers = comfyui.get("/xpufleet/api/workers")
        assert isinstance(workers["workers"], list)
        code, body = comfyui.request("POST", "/xpufleet/sidecar/start", {})
        assert code == 200 and body["started"] is False and body["pid"] == sc.pid
        code, _ = comfyui.request("GET", "/xpufleet/api/agents/ws")
        assert code == 404
        seen = json.dumps([status, run, workers, body])
        assert sc.info["token"] not in seen  # the browser never sees the session token
    finally:
        sc.stop()
    assert comfyui.get("/xpufleet/sidecar")["running"] is False


def test_sidecar_start_from_comfyui(comfyui):
    code, body = comfyui.request("POST", "/xpufleet/sidecar/start", {"port": 0}, timeout=150)
    assert code == 200 and body["started"] is True, body
    sc = harness.Sidecar(comfyui.home)
    sc.info = read_runtime(comfyui.home)
    try:
        assert sc.info is not None and sc.info["pid"] == body["pid"] and sc.url == body["url"]
        sc.client = Client(sc.url, sc.info["token"], timeout=30)
        assert comfyui.get("/xpufleet/sidecar")["running"] is True
        assert psutil.Process(sc.pid).cmdline()[0] == str(comfyui.python)
        # ComfyUI's interpreter ran `xpufleet start`; the sidecar and its run process import the plugin
        # from custom_nodes/ (it is not installed there)
        queue_and_read_back(comfyui, sc, "started-by-comfyui")
    finally:
        pid = sc.info["pid"] if sc.info else None
        sc.stop()
    assert not pid_alive(pid)
