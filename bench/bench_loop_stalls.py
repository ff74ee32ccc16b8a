"""Event-loop stalls on graphs of many TrainingLoops (issue 19): each heavy request, timed, while
``GET /api/health`` is sampled on another connection.

    python bench/bench_loop_stalls.py [--sizes 1000,5000] [--cancel-variants 5000] [--timeout 120]

A real sidecar (``xpufleet start --port 0``, a temporary XPUFLEET_HOME) and a real agent simulating one
CUDA card (``xpufleet agent start --simulate cuda:0=24``), stopped once it has connected: runs for it are
accepted and wait, so the cancelled sweep's variants stay queued (nothing trains). Graphs, N nodes in all:

* ``chain``: a valid training graph whose N-5 TrainingLoops each train the previous one's model;
* ``ring``: the probe's cycle, N TrainingLoops where node i takes model=[i-1, 0] (refused by validation)
  (both from bench_validate.py).

Requests: ``POST /api/runs`` (target local; an admitted run is cancelled at once), ``POST
/api/sweeps?dry_run=true`` (4 variants, target local), ``POST /api/estimates``, then a sweep of
``--cancel-variants`` queued variants for the stopped worker (its creation is timed too) and its
``POST /api/sweeps/{id}/cancel``.

Meanwhile a thread sends ``GET /api/health`` every ``--every-ms`` on its own keep-alive connection, from the
request until 0.3 s after its answer. Printed: the request's time and answer, and the worst health wait
meanwhile, against the unloaded health p50 measured first in the same run, and the load average. A
request that runs past ``--timeout`` is shown as such; the sidecar is then killed and a fresh one started.
No goal is asserted: tests/server/sidecar/test_loop_stalls_e2e.py holds the pass/fail bound.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_sweep import CLI, GRAPH, start_fleet  # noqa: E402 - the bench folder is no package
from bench_validate import chain  # noqa: E402
from bench_validate import cycle as ring  # noqa: E402

from xpufleet.common.runtime_file import read_runtime  # noqa: E402

SHAPES = {"chain": chain, "ring": ring}
SWEPT = {"chain": ("4.lr", [0.1, 0.01, 0.001, 0.0001]), "ring": ("1.epochs", [1, 2, 3, 4])}


class Conn:
    """One keep-alive HTTP connection to the sidecar (reconnects after an error)."""

    def __init__(self, info: dict[str, Any], timeout: float) -> None:
        self.info, self.timeout = info, timeout
        self.conn: http.client.HTTPConnection | None = None

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {self.info['token']}", "Content-Type": "application/json"}
        data = None if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        if self.conn is None:
            self.conn = http.client.HTTPConnection(self.info["host"], self.info["port"], timeout=self.timeout)
        try:
            self.conn.request(method, path, body=data, headers=headers)
            resp = self.conn.getresponse()
            raw = resp.read()
        except Exception:
            self.close()
            raise
        try:
            return resp.status, json.loads(raw) if raw else None
        except ValueError:
            return resp.status, raw.decode("utf-8", "replace")

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


class HealthSampler(threading.Thread):
    """``GET /api/health`` every ``every`` seconds until stopped; keeps how long each one waited."""

    def __init__(self, info: dict[str, Any], every: float) -> None:
        super().__init__(daemon=True)
        self.conn = Conn(info, timeout=600)
        self.every = every
        self.waits: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            t0 = time.perf_counter()
            try:
                self.conn.call("GET", "/api/health")
            except Exception:  # noqa: BLE001 - a refused or reset health check counts as its wait
                pass
            self.waits.append(time.perf_counter() - t0)
            self.halt.wait(self.every)

    def stop(self) -> list[float]:
        self.halt.set()
        self.join(600)
        self.conn.close()
        return self.waits


def unloaded_health(info: dict[str, Any], n: int = 100) -> list[float]:
    conn = Conn(info, timeout=30)
    waits = []
    for _ in range(n):
        t0 = time.perf_counter()
        conn.call("GET", "/api/health")
        waits.append(time.perf_counter() - t0)
        time.sleep(0.01)
    conn.close()
    return waits


class Bench:
    """The fleet under test; restarted when a request runs past the timeout (its loop is stuck)."""

    def __init__(self, timeout: float, every: float) -> None:
        self.timeout, self.every = timeout, every
        self.homes: list[Path] = []
        self.rows: list[dict[str, Any]] = []
        self.start()

    def start(self) -> None:
        home = Path(tempfile.mkdtemp(prefix="xpufleet-bench-stalls-"))
        self.homes.append(home)
        _, self.env = start_fleet(home)
        self.info = read_runtime(home)
        self.conn = Conn(self.info, timeout=self.timeout)

    def stop(self, kill: bool = False) -> None:
        self.conn.close()
        if kill:
            os.kill(int(self.info["pid"]), signal.SIGKILL)
        else:
            subprocess.run([*CLI, "stop"], env=self.env, capture_output=True, timeout=300)

    def measure(self, request: str, shape: str, nodes: int, method: str, path: str, body: Any) -> tuple[int, Any]:
        data = json.dumps(body).encode()
        sampler = HealthSampler(self.info, self.every)
        sampler.start()
        t0 = time.perf_counter()
        try:
            status, answer = self.conn.call(method, path, data)
        except TimeoutError:
            status, answer = 0, None
        took = time.perf_counter() - t0
        if status:
            time.sleep(0.3)  # work the answer left behind on the loop shows here too
        waits = sampler.stop() if status else []
        self.rows.append({"request": request, "shape": shape, "nodes": nodes, "status": status,
                          "took_s": took, "worst_health_s": max(waits, default=None), "samples": len(waits)})
        print(f"  {request} {shape} {nodes}: {status or 'timed out'} in {took:.2f} s, worst health "
              f"{max(waits, default=float('nan')) * 1e3:.0f} ms", flush=True)
        if not status:  # the loop is stuck: a fresh sidecar for what follows
            sampler.halt.set()
            self.stop(kill=True)
            self.start()
        return status, answer

    def graph_routes(self, shape: str, n: int) -> None:
        graph = SHAPES[shape](n)
        status, answer = self.measure("POST /api/runs", shape, n, "POST", "/api/runs", {"graph": graph})
        if status == 201:
            self.conn.call("POST", f"/api/runs/{answer['run_id']}/cancel", {})
        path, values = SWEPT[shape]
        sweep = {"name": "stalls", "graph": graph, "objective": {"metric": "val_accuracy"},
                 "parameters": {path: values}, "options": {"target": "local"}}
        self.measure("POST /api/sweeps?dry_run=true", shape, n, "POST", "/api/sweeps?dry_run=true", sweep)
        self.measure("POST /api/estimates", shape, n, "POST", "/api/estimates", {"graph": graph})

    def cancel_sweep(self, variants: int) -> None:
        body = {"name": "cancel-me", "graph": GRAPH, "objective": {"metric": "val_accuracy"},
                "parameters": {"5.lr": {"low": 1e-5, "high": 0.3, "log": True, "steps": variants}},
                "set": {"10.location": "run_dir"}, "max_runs": variants,
                "options": {"target": {"worker": "box", "devices": ["cuda:0"]}}}
        status, answer = self.measure("POST /api/sweeps (queued)", "variants", variants, "POST", "/api/sweeps", body)
        if status == 201:
            self.measure("POST /api/sweeps/{id}/cancel", "variants", variants, "POST",
                         f"/api/sweeps/{answer['sweep_id']}/cancel", {})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="1000,5000", help="graph sizes in nodes, comma-separated")
    ap.add_argument("--cancel-variants", type=int, default=5000, help="queued variants of the cancelled sweep")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take before it is abandoned")
    ap.add_argument("--every-ms", type=float, default=20.0, help="health sampling interval")
    ap.add_argument("--shapes", default="chain,ring", help="graph shapes, comma-separated")
    args = ap.parse_args()
    load_before = os.getloadavg()
    bench = Bench(args.timeout, args.every_ms / 1000)
    try:
        base = unloaded_health(bench.info)
        for n in (int(s) for s in args.sizes.split(",")):
            for shape in args.shapes.split(","):
                bench.graph_routes(shape, n)
        if args.cancel_variants:
            bench.cancel_sweep(args.cancel_variants)
        base += unloaded_health(bench.info)
    finally:
        bench.stop()
        for home in bench.homes:
            shutil.rmtree(home, ignore_errors=True)
    load_after = os.getloadavg()
    p50 = statistics.median(base)
    print(f"\nunloaded GET /api/health: p50 {p50 * 1e3:.1f} ms, max {max(base) * 1e3:.1f} ms "
          f"({len(base)} calls, before and after)")
    print(f"{'request':<30} {'graph':<9} {'nodes':>6} {'answer':>7} {'took':>9} {'worst health':>13} {'x p50':>7}")
    for r in bench.rows:
        worst = r["worst_health_s"]
        took = f"{r['took_s']:.2f} s" if r["status"] else f">{args.timeout:.0f} s"
        shown = f"{worst * 1e3:.0f} ms" if worst is not None else "(stuck)"
        ratio = f"{worst / p50:.0f}x" if worst is not None else "-"
        print(f"{r['request']:<30} {r['shape']:<9} {r['nodes']:>6} {r['status'] or 'timeout':>7} {took:>9} "
              f"{shown:>13} {ratio:>7}")
    print(f"load average before {' '.join(f'{x:.2f}' for x in load_before)}, after "
          f"{' '.join(f'{x:.2f}' for x in load_after)} ({os.cpu_count()} CPUs)")
    print(json.dumps({"health_p50_s": p50, "rows": bench.rows, "load_before": load_before, "load_after": load_after}))


if __name__ == "__main__":
    main()
