"""Many readers of one large run (issue 29, "Streams never hold the loop"): what the stream test
(test_streams_e2e.py) and bench/bench_streams.py share.

A finished canvas run with N ``metric`` events, recorded as the plugin inside ComfyUI records one
(``POST /api/canvas/runs``, then its events in batches of ``CANVAS_EVENTS_MAX``, the last with the run's
end); clients that read its ``/events/stream`` whole; and pollers that time ``GET /api/health`` and the
worker's state meanwhile. Loaded by path (tests/server/conftest.py style; the bench uses benchlib)."""

from __future__ import annotations

import http.client
import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from xpufleet.constants import CANVAS_EVENTS_MAX

METRIC = "train_loss_batch"


def _conn(url: str, timeout: float) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=timeout)


def call(conn: http.client.HTTPConnection, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """One request on a keep-alive connection: (status, JSON answer)."""
    data = None if body is None else json.dumps(body).encode()
    conn.request(method, path, body=data, headers={"Authorization": f"Bearer {token}",
                                                   "Content-Type": "application/json"})
    resp = conn.getresponse()
    raw = resp.read()
    return resp.status, json.loads(raw) if raw else None


def big_run(url: str, token: str, graph: dict[str, Any], n_events: int) -> str:
    """A finished canvas run holding ``n_events`` metric events (step 0, 1, ...), recorded through the
    plugin's routes; its id."""
    conn = _conn(url, 300)
    try:
        status, run = call(conn, token, "POST", "/api/canvas/runs", {
            "prompt_id": "streams", "name": "a large run", "graph": graph, "comfy_pid": os.getpid()})
        assert status == 201, run
        for start in range(0, n_events, CANVAS_EVENTS_MAX):
            batch = [{"type": "metric", "payload": {"node": "8", "name": METRIC, "value": 1.0 / (1 + i), "step": i},
                      "ts": 1.0 + i, "seq": i + 1} for i in range(start, min(n_events, start + CANVAS_EVENTS_MAX))]
            body: dict[str, Any] = {"events": batch}
            if start + CANVAS_EVENTS_MAX >= n_events:
                body["finished"] = {"status": "succeeded", "error": None, "final_metrics": {METRIC: batch[-1]["payload"]["value"]}}
            status, answer = call(conn, token, "POST", f"/api/canvas/runs/{run['id']}/events", body)
            assert status == 200 and answer["stored"] == len(batch) + ("finished" in body), answer  # + run_finished
        return str(run["id"])
    finally:
        conn.close()


@dataclass
class StreamRead:
    """What one client read of a stream: each message's (id, type, data), and how long it took."""

    messages: list[tuple[int, str, bytes]] = field(default_factory=list)
    seconds: float = 0.0
    error: BaseException | None = None


def read_stream(url: str, token: str, run_id: str, timeout: float = 600.0) -> StreamRead:
    """``GET /api/runs/{id}/events/stream`` read to its end (the run has ended, so the server closes it)."""
    out = StreamRead()
    t0 = time.perf_counter()
    conn = _conn(url, timeout)
    try:
        conn.request("GET", f"/api/runs/{run_id}/events/stream", headers={"Authorization": f"Bearer {token}"})
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("Content-Type", "").startswith("text/event-stream"), resp.status
        body = resp.read()
        for block in body.split(b"\n\n"):
            if not block or block.startswith(b":"):
                continue  # the end, or a keep-alive comment
            id_line, event_line, data_line = block.split(b"\n")
            out.messages.append((int(id_line[4:]), event_line[7:].decode(), data_line[6:]))
    except BaseException as exc:  # noqa: BLE001 - reported by the caller
        out.error = exc
    finally:
        conn.close()
        out.seconds = time.perf_counter() - t0
    return out


class Poller(threading.Thread):
    """``GET path`` every ``every`` seconds on its own keep-alive connection until stopped: each answer
    (status, JSON, or the exception) with its wait."""

    def __init__(self, url: str, token: str, path: str, every: float = 0.05, timeout: float = 600.0) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.path, self.every, self.timeout = url, token, path, every, timeout
        self.samples: list[tuple[int | BaseException, Any, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        conn = _conn(self.url, self.timeout)
        while not self.halt.is_set():
            t0 = time.perf_counter()
            try:
                status, answer = call(conn, self.token, "GET", self.path)
            except Exception as exc:  # noqa: BLE001 - a refused or timed-out poll is a sample too
                status, answer = exc, None
                conn.close()
                conn = _conn(self.url, self.timeout)
            self.samples.append((status, answer, time.perf_counter() - t0))
            self.halt.wait(self.every)
        conn.close()

    def stop(self) -> list[tuple[int | BaseException, Any, float]]:
        self.halt.set()
        self.join(self.timeout + 30)
        return self.samples


@dataclass
class Load:
    """``clients`` stream readers of one run, with health and the worker list polled meanwhile."""

    reads: list[StreamRead]
    health: list[tuple[int | BaseException, Any, float]]
    workers: list[tuple[int | BaseException, Any, float]]
    seconds: float


def readers(url: str, token: str, run_id: str, clients: int, every: float = 0.05) -> Load:
    """Start the pollers, then ``clients`` readers at once; when every reader is done, stop the pollers."""
    health = Poller(url, token, "/api/health", every)
    workers = Poller(url, token, "/api/workers", every)
    health.start()
    workers.start()
    reads: list[StreamRead | None] = [None] * clients

    def one(i: int) -> None:
        reads[i] = read_stream(url, token, run_id)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join(900)
    seconds = time.perf_counter() - t0
    return Load([r or StreamRead(error=TimeoutError("reader never ended")) for r in reads], health.stop(),
                workers.stop(), seconds)
