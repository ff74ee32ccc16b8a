"""Many readers of one large run's event stream (issue 29, "Streams never hold the loop").

    python bench/bench_streams.py [--clients 1,3,10,20] [--events 100000] [--every-ms 50]
                                  [--before /tmp/h3-base-site]

A real sidecar (``xpufleet start --foreground --port 0``, a temporary XPUFLEET_HOME) and a real agent
simulating one CUDA card (``xpufleet agent start --simulate cuda:0=24``, heartbeat 1 s) that stays
connected. A finished run with ``--events`` metric events is recorded through the canvas routes, as the
plugin inside ComfyUI records one (tests/server/sidecar/stream_load.py). Then, for each client count N,
N clients read its ``GET /api/runs/{id}/events/stream`` whole at once, while ``GET /api/health`` and
``GET /api/workers`` are each sent every ``--every-ms`` on their own keep-alive connection.

Printed per row: health's p50 and worst wait, /api/workers' worst wait, whether the agent stayed Online
in every /api/workers answer, the readers' median time to read it all, and the load average; the
unloaded health p50 is measured first. With ``--before SITE`` (a folder holding an ``xpufleet`` link to
another checkout, e.g. the code before the fix) a second fleet runs that code, and each row is measured
on both, the side that goes first alternating from row to row. No goal is asserted: the test
(tests/server/sidecar/test_streams_e2e.py) checks that every event arrives and the agent stays Online.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import pct, tests_module  # noqa: E402 - the bench folder is no package

fh = tests_module("server/fleet_harness.py")
sl = tests_module("server/sidecar/stream_load.py")


class Side:
    """One sidecar and its agent, running the code found on ``site`` (None: this checkout)."""

    def __init__(self, name: str, site: str | None, events: int) -> None:
        self.name = name
        self.home = Path(tempfile.mkdtemp(prefix=f"xpufleet-bench-streams-{name}-"))
        extra = {"PYTHONPATH": os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH")) if p)} if site else {}
        env = fh.base_env(self.home, **extra)
        self.sidecar = fh.SidecarProc(self.home, env)
        self.agent = fh.AgentProc(self.home, env, "--name", "box", "--simulate", "cuda:0=24", label="box")
        self.agent.wait_connected()
        t0 = time.perf_counter()
        self.run_id = sl.big_run(self.sidecar.url, self.sidecar.token, fh.iris_graph(1), events)
        print(f"[{name}] {events:,} events recorded in {time.perf_counter() - t0:.1f} s "
              f"(xpufleet from {site or 'this checkout'})", flush=True)

    def unloaded(self, n: int = 60) -> float:
        poller = sl.Poller(self.sidecar.url, self.sidecar.token, "/api/health", 0.01)
        poller.start()
        while len(poller.samples) < n:
            time.sleep(0.05)
        return statistics.median(w for _, _, w in poller.stop())

    def measure(self, clients: int, every: float) -> dict[str, Any]:
        load = sl.readers(self.sidecar.url, self.sidecar.token, self.run_id, clients, every)
        health = [w for _, _, w in load.health]
        statuses = set()
        for status, answer, _ in load.workers:
            box = next((w for w in answer["workers"] if w["name"] == "box"), None) if status == 200 else None
            statuses.add(box["status"] if box else f"no answer ({status})")
        errors = [r.error for r in load.reads if r.error is not None]
        counts = {len(r.messages) for r in load.reads}
        return {"side": self.name, "clients": clients, "health_p50_ms": 1000 * statistics.median(health),
                "health_p99_ms": 1000 * pct(health, 0.99), "health_worst_s": max(health),
                "workers_worst_s": max(w for _, _, w in load.workers), "agent": "/".join(sorted(statuses)),
                "read_s": statistics.median(r.seconds for r in load.reads), "polls": len(health),
                "messages": "/".join(map(str, sorted(counts))), "errors": len(errors),
                "load": os.getloadavg()[0]}

    def close(self) -> None:
        self.agent.stop()
        self.sidecar.stop()
        shutil.rmtree(self.home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,3,10,20")
    ap.add_argument("--events", type=int, default=100_000)
    ap.add_argument("--every-ms", type=float, default=50.0)
    ap.add_argument("--before", default=None, help="a site folder whose xpufleet is the code to compare with")
    args = ap.parse_args()
    clients = [int(c) for c in args.clients.split(",")]
    sides = [Side("after", None, args.events)]
    if args.before:
        sides.append(Side("before", args.before, args.events))
    try:
        for side in sides:
            print(f"[{side.name}] unloaded health p50 {1000 * side.unloaded():.1f} ms; load {os.getloadavg()[0]:.2f}",
                  flush=True)
        print(f"{'side':>6} {'clients':>7} {'health p50':>10} {'p99':>8} {'worst':>8} {'workers worst':>13} "
              f"{'agent':>22} {'read (median)':>13} {'messages':>9} {'load':>5}")
        rows = []
        for i, n in enumerate(clients):
            for side in (sides if i % 2 == 0 else sides[::-1]):  # who goes first alternates row by row
                r = side.measure(n, args.every_ms / 1000)
                rows.append(r)
                print(f"{r['side']:>6} {n:>7} {r['health_p50_ms']:>8.1f}ms {r['health_p99_ms']:>6.0f}ms "
                      f"{r['health_worst_s']:>7.2f}s {r['workers_worst_s']:>12.2f}s {r['agent']:>22} "
                      f"{r['read_s']:>12.1f}s {r['messages']:>9} {r['load']:>5.2f}"
                      + (f"  {r['errors']} readers failed" if r["errors"] else ""), flush=True)
    finally:
        for side in sides:
            side.close()


if __name__ == "__main__":
    main()
