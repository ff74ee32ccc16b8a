"""Submit-to-first-node latency of a trivial graph on the local target (issue 3).

    python bench/bench_submit_latency.py [--runs 5]

Starts a real sidecar (`xpufleet start --port 0`, XPUFLEET_HOME in a temporary folder), submits the
same small iris graph N times one after the other through the HTTP API, and reads each run's event log:

* submit: the POST /api/runs round trip;
* assigned: submit -> the dispatcher placed it (status event);
* first node: submit -> the run child's first ``node_started`` (a new process has started, imported
  the runner, the executor and the node classes, and validated the graph);
* finished: submit -> ``run_finished`` (includes the nodes' own work: torch and scikit-learn imports).

Baselines measured in the same run: starting a bare Python (`python -c pass`) and a Python that imports
what the run child imports before its first node (the floor a fresh process per run cannot beat).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from xpufleet.server.cli.client import Client
from xpufleet.server.sidecar.runtime_file import read_runtime

GRAPH = {
    "1": {"class_type": "XPUDataset", "inputs": {"name": "iris", "val_split": 0.2, "seed": 0, "normalize": "standard"}},
    "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["1", 0], "batch_size": 16, "shuffle": True,
                                                    "num_workers": 0, "drop_last": False}},
    "3": {"class_type": "XPUMLP", "inputs": {"hidden": "16", "activation": "relu", "dropout": 0.0, "seed": 0,
                                             "dataset_info": ["1", 2]}},
    "4": {"class_type": "XPUOptimizer", "inputs": {"name": "adam", "lr": 0.01, "weight_decay": 0.0, "momentum": 0.9}},
    "5": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}},
    "6": {"class_type": "XPUTrainingLoop", "inputs": {
        "model": ["3", 0], "dataloader": ["2", 0], "optimizer": ["4", 0], "loss": ["5", 0], "epochs": 1,
        "max_steps": 0, "device": "cpu", "precision": "fp32", "tensorboard": False, "strategy": "single"}},
    "7": {"class_type": "XPUEvaluate", "inputs": {"model": ["6", 0], "dataloader": ["2", 0], "device": "cpu",
                                                  "precision": "fp32"}},
}

CHILD_IMPORTS = "import xpufleet.server.run.runner, xpufleet.server.run.executor, xpufleet.nodes"


def spawn_time(code: str, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", code], check=True)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="xpufleet-bench-"))
    env = {**os.environ, "XPUFLEET_HOME": str(home)}
    cli = [sys.executable, "-m", "xpufleet.server"]
    subprocess.run([*cli, "start", "--port", "0"], env=env, check=True, capture_output=True)
    try:
        info = read_runtime(home)
        client = Client(info["url"], info["token"])
        rows = []
        for i in range(args.runs + 1):  # the first run warms the OS file cache; not counted
            t0 = time.time()
            run_id = client.submit(GRAPH, {"name": f"latency-{i}"})["run_id"]
            t_submit = time.time() - t0
            run = client.follow(run_id)
            assert run["status"] == "succeeded", run
            events = client.events(run_id, limit=1000)["events"]
            first = {}
            for ev in events:
                key = ev["type"] if ev["type"] != "status" else f"status:{ev['payload']['status']}"
                first.setdefault(key, ev["ts"])
            if i == 0:
                continue
            rows.append({"submit": t_submit, "assigned": first["status:assigned"] - t0,
                         "first_node": first["node_started"] - t0, "finished": first["run_finished"] - t0})
    finally:
        subprocess.run([*cli, "stop"], env=env, capture_output=True)
        shutil.rmtree(home, ignore_errors=True)
    bare = spawn_time("pass", 5)
    imports = spawn_time(CHILD_IMPORTS, 5)
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    print(f"{args.runs} runs of a trivial iris graph on the local target (medians):")
    print(f"  POST /api/runs round trip     {med['submit'] * 1e3:8.1f} ms")
    print(f"  submit -> assigned            {med['assigned'] * 1e3:8.1f} ms")
    print(f"  submit -> first node_started  {med['first_node'] * 1e3:8.1f} ms")
    print(f"  submit -> run_finished        {med['finished'] * 1e3:8.1f} ms")
    print("baselines (same machine, same run):")
    print(f"  python -c pass                {bare * 1e3:8.1f} ms")
    print(f"  python -c '{CHILD_IMPORTS}'  {imports * 1e3:8.1f} ms")
    print(f"first node vs the import floor of a fresh run process: {med['first_node'] / imports:.2f}x "
          f"(+{(med['first_node'] - imports) * 1e3:.0f} ms)")
    print(json.dumps({"medians_ms": {k: round(v * 1e3, 1) for k, v in med.items()},
                      "baseline_ms": {"bare_python": round(bare * 1e3, 1), "child_imports": round(imports * 1e3, 1)}}))


if __name__ == "__main__":
    main()
