"""Submit -> first node of a small training graph, warm start against cold spawn, in one run (issue 8).

    python bench/bench_submit_latency.py [--runs 20] [--batch 100] [--modes warm,cold]

For each mode it starts a real sidecar (`xpufleet start --port 0`, a temporary XPUFLEET_HOME): *warm*
(the default: run processes forked from the sidecar's pre-warmed forkserver) and *cold*
(`XPUFLEET_WARM_START=0`: a new interpreter per run). Then:

* latency: ``--runs`` runs of the same iris training graph one after the other (the first of each mode
  is not counted): submit -> its 201 (the run is in state.db), and from each run's event log: submit ->
  ``node_started`` of the first node, submit ->
  ``node_finished`` of the first node (its work done: a cold process has imported torch and
  scikit-learn by then), submit -> ``run_finished``;
* throughput: ``--batch`` one-step runs (16 samples) submitted at once on the CPU slots (2 at a time),
  runs/s from the first submit to the last ``run_finished``.

Goal (issue 8): warm p50 submit -> first node <= 100 ms on this CPU. Printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from benchlib import pct, tests_module  # bench/ (this script's folder) is on sys.path

from xpufleet.common.client import Client

GOAL_MS = 100.0
gp = tests_module("graph_parts.py")  # the test suite's graph nodes


def graph(n_samples: int = 0, max_steps: int = 0) -> dict[str, Any]:
    """The iris graph (``n_samples`` > 0: synthetic data of that size instead) training one epoch."""
    data = gp.dataset("synthetic_classification", val_split=0.25, normalize="none", n_samples=n_samples,
                      n_features=4, n_classes=2) if n_samples else gp.dataset()
    return {"1": data, "2": gp.loader("1"), "3": gp.mlp("1"), "4": gp.optimizer(), "5": gp.loss(),
            "6": gp.training_loop("3", "2", "4", "5", max_steps=max_steps, device="cpu", strategy="single")}


@contextmanager
def sidecar(warm: bool) -> Iterator[Client]:
    """A sidecar (the e2e suites' harness) in a temporary XPUFLEET_HOME, warm or cold start; its client."""
    home = Path(tempfile.mkdtemp(prefix=f"xpufleet-bench-{'warm' if warm else 'cold'}-"))
    sc = tests_module("server/sidecar_harness.py").Sidecar(home, {"XPUFLEET_WARM_START": "1" if warm else "0"})
    try:
        yield sc.start().client
    finally:
        sc.stop()
        shutil.rmtree(home, ignore_errors=True)


def first_times(client: Client, run_id: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for ev in client.events(run_id, limit=1000)["events"]:
        out.setdefault(ev["type"], ev["ts"])
    return out


def latency(client: Client, runs: int) -> list[dict[str, float]]:
    rows = []
    g = graph()
    for i in range(runs + 1):  # the first run warms caches (and, warm, waits for the forkserver): not counted
        t0 = time.time()
        run_id = client.submit(g, {"name": f"latency-{i}"})["run_id"]
        answered = time.time() - t0  # the 201: the run is in state.db (docs/sidecar.md, "State on disk")
        run = client.follow(run_id)
        assert run["status"] == "succeeded", run
        first = first_times(client, run_id)
        if i:
            rows.append({"answered": answered, "first_node_started": first["node_started"] - t0,
                         "first_node_finished": first["node_finished"] - t0,
                         "run_finished": first["run_finished"] - t0})
    return rows


def throughput(client: Client, batch: int) -> float:
    g = graph(n_samples=16, max_steps=1)
    t0 = time.time()
    ids = [client.submit(g, {"name": f"batch-{i}"})["run_id"] for i in range(batch)]
    last = 0.0
    for run_id in ids:
        run = client.follow(run_id)
        assert run["status"] == "succeeded", run
        last = max(last, run["finished_at"])
    return batch / (last - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=20, help="latency runs per mode (default 20)")
    ap.add_argument("--batch", type=int, default=100, help="runs of the throughput batch (default 100)")
    ap.add_argument("--modes", default="warm,cold", help="warm, cold or both (default warm,cold)")
    args = ap.parse_args()
    modes = [m for m in ("warm", "cold") if m in args.modes.split(",")]
    if not modes:
        ap.error("--modes: warm, cold or warm,cold")
    results: dict[str, Any] = {}
    for mode in modes:
        with sidecar(mode == "warm") as client:
            rows = latency(client, args.runs)
            rate = throughput(client, args.batch)
        results[mode] = {
            "p50_ms": {k: round(statistics.median(r[k] for r in rows) * 1e3, 1) for k in rows[0]},
            "p90_ms": {k: round(pct([r[k] for r in rows], 0.9) * 1e3, 1) for k in rows[0]},
            "runs_per_s": round(rate, 2),
        }
    print(f"{args.runs} sequential runs of an iris training graph per mode (p50 / p90, ms):")
    for key in ("answered", "first_node_started", "first_node_finished", "run_finished"):
        print(f"  submit -> {key:<20} " + "   ".join(
            f"{m} {results[m]['p50_ms'][key]:8.1f} / {results[m]['p90_ms'][key]:8.1f}" for m in modes))
    print(f"{args.batch} one-step runs on the CPU slots: " + ", ".join(
        f"{m} {results[m]['runs_per_s']:.2f} runs/s" for m in modes))
    if "warm" in results:
        w = results["warm"]
        met = w["p50_ms"]["first_node_finished"] <= GOAL_MS
        print(f"goal: warm p50 submit -> first node (finished) <= {GOAL_MS:g} ms: "
              f"{'met' if met else 'NOT met'} ({w['p50_ms']['first_node_finished']:.1f} ms)")
    print(json.dumps(results))


if __name__ == "__main__":
    main()
