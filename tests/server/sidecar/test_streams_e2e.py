"""Issue 29, "Streams never hold the loop", end to end: a real sidecar and a real agent (simulated card) as
subprocesses on loopback; a finished run with 100,000 metric events, recorded as the plugin inside ComfyUI
records one; 20 clients read its ``/events/stream`` whole at once while ``GET /api/health`` and ``GET
/api/workers`` are polled. Every client gets every event once, in order; every poll is answered, and the
agent stays Online throughout (its heartbeats kept their pace). No latency is asserted here: the table
of waits is bench/bench_streams.py's. Before the fix, 20 readers held the loop for tens of seconds and the
agent was marked Disconnected.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import fleet_harness as fh  # registered by tests/server/conftest.py
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]

EVENTS = 100_000
CLIENTS = 20


def _stream_load():
    if "stream_load" not in sys.modules:
        spec = importlib.util.spec_from_file_location("stream_load", Path(__file__).with_name("stream_load.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["stream_load"] = module
        spec.loader.exec_module(module)
    return sys.modules["stream_load"]


def test_twenty_readers_of_a_100k_event_run_get_it_all_while_health_and_the_agent_keep_answering(fleet):
    sl = _stream_load()
    sc = fleet.sidecar()
    agent = fleet.agent("--name", "box", "--simulate", "cuda:0=24", label="box")
    agent.wait_connected()
    sc.wait_worker("box", "Online")
    run_id = sl.big_run(sc.url, sc.token, fh.iris_graph(1), EVENTS)
    run = sc.run(run_id)
    assert run["status"] == "succeeded" and run["cursor"] > EVENTS, run

    load = sl.readers(sc.url, sc.token, run_id, CLIENTS)

    last = sc.run(run_id)["cursor"]
    for i, read in enumerate(load.reads):
        assert read.error is None, (i, read.error)
        ids = [m[0] for m in read.messages]
        assert ids == list(range(1, last + 1)), f"client {i}: {len(ids)} messages, not cursors 1..{last} once each"
        steps = [json.loads(data)["payload"]["step"] for _, kind, data in read.messages if kind == "metric"]
        assert steps == list(range(EVENTS)), f"client {i}: the metric events are not steps 0..{EVENTS - 1} in order"
        assert read.messages[-1][1] == "run_finished"
    # every poll answered, and the worker never left Online while 20 streams were read
    assert load.health and all(status == 200 and answer["status"] == "ok" for status, answer, _ in load.health), \
        [s for s in load.health if s[0] != 200][:5]
    assert load.workers, "no worker poll was answered"
    for status, answer, _ in load.workers:
        assert status == 200, (status, answer)
        box = next(w for w in answer["workers"] if w["name"] == "box")
        assert box["status"] == "Online", box
    assert sc.worker("box")["status"] == "Online"
