"""Scan + predict over the 50 largest ComfyUI template workflows (goal: median and p99 <= 5 ms).

    python bench/bench_predict.py [--count 50] [--reps 20]

Every model file the workflows name is laid out as a sparse file (sizes from 0.1 to 24 GiB) in a
temporary models folder; the snapshot is fixed, so the figures time the scan (JSON walk, subgraph
expansion, path checks, stat calls) and the formula. Printed beside them, as the same-run baseline,
is ``json.loads`` of the same documents (what any route pays just to read the request).

Wall-clock figures are what a caller waits; on a shared, loaded machine their p99 mostly measures
time the process spent waiting for a core, so the CPU time of the calling thread (``thread_time``)
is printed beside them, with the load average the run saw.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from importlib import resources
from pathlib import Path

from xpufleet.predictor.resolve import DirsResolver
from xpufleet.predictor.scan import scan_workflow  # needs `pip install -e .`
from xpufleet.predictor.service import predict_workflow
from xpufleet.predictor.snapshot import Snapshot

GiB = 1024**3


def largest_templates(count: int) -> list[Path]:
    import comfyui_workflow_templates_json as pkg

    folder = Path(resources.files(pkg) / "templates")
    files = [p for p in folder.glob("*.json") if not p.name.startswith("index") and p.name != "fuse_options.json"]
    return sorted(files, key=lambda p: p.stat().st_size, reverse=True)[:count]


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = min(len(xs) - 1, max(0, int(round(q / 100 * (len(xs) - 1)))))
    return xs[k]


def timed(fn, docs, reps: int) -> tuple[list[float], list[float]]:
    """Per call: wall-clock ms and CPU ms of this thread."""
    wall, cpu = [], []
    for _ in range(reps):
        for d in docs:
            c0, t0 = time.thread_time(), time.perf_counter()
            fn(d)
            wall.append((time.perf_counter() - t0) * 1000)
            cpu.append((time.thread_time() - c0) * 1000)
    return wall, cpu


def load_average() -> str:
    try:
        return ", ".join(f"{x:.1f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=50)
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    paths = largest_templates(args.count)
    texts = [p.read_text(encoding="utf-8") for p in paths]
    docs = [json.loads(t) for t in texts]
    rng = random.Random(1)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "models"
        resolver = DirsResolver([root])
        n_files = 0
        for d in docs:
            for m in scan_workflow(d, resolver).models:
                if m.status == "missing" and m.folder:
                    f = root / m.folder / m.name
                    f.parent.mkdir(parents=True, exist_ok=True)
                    if not f.exists():
                        with open(f, "wb") as fh:
                            fh.truncate(int(rng.uniform(0.1, 24) * GiB))
                        n_files += 1
        snap = Snapshot(vram_free_gb=20, vram_total_gb=24, vram_allocated_gb=1, vram_reserved_gb=0.5,
                        ram_free_gb=32, commit_used_gb=20, commit_limit_gb=64, device="cuda:0", platform="nvidia")
        os.environ["XPUFLEET_MODEL_DIRS"] = str(root)
        os.environ.setdefault("XPUFLEET_HOME", str(Path(tmp) / "home"))
        sys.modules.pop("folder_paths", None)
        found = sum(m.status == "found" for d in docs for m in scan_workflow(d, DirsResolver([root])).models)
        nodes = sum(len(d.get("nodes", [])) + sum(len(s.get("nodes", [])) for s in
                    (d.get("definitions") or {}).get("subgraphs") or []) for d in docs)
        print(f"{len(docs)} workflows ({sum(map(len, texts)) / 1e6:.1f} MB JSON, {nodes} nodes with subgraphs), "
              f"{n_files} sparse model files, {found} model references found; {args.reps} reps each")

        runs = {
            "json.loads (baseline)": (lambda t: json.loads(t), texts),
            "scan + predict (route path: resolver per call)": (lambda d: predict_workflow(d, snap), docs),
            "scan + predict (shared resolver)": (lambda d: predict_workflow(d, snap, resolver=resolver,
                                                                            gamma_overrides={}), docs),
            "scan + predict, all P3 options": (lambda d: predict_workflow(
                d, snap, resolver=resolver, gamma_overrides={},
                options={"weight_bytes": True, "topology": True, "activation_overhead": True,
                         "calibration": {"factor": 1.1}}), docs),
        }
        timed(runs["scan + predict (route path: resolver per call)"][0], docs, 1)  # warm caches
        base_med = None
        print(f"load average before: {load_average()}")
        print(f"{'':50s} {'wall median':>11s} {'wall p99':>9s} {'cpu median':>11s} {'cpu p99':>8s} "
              f"{'x baseline':>10s}  (ms)")
        for name, (fn, inputs) in runs.items():
            wall, cpu = timed(fn, inputs, args.reps)
            med, p99 = statistics.median(wall), percentile(wall, 99)
            base_med = base_med or med
            print(f"{name:50s} {med:11.3f} {p99:9.3f} {statistics.median(cpu):11.3f} {percentile(cpu, 99):8.3f} "
                  f"{med / base_med:10.1f}")
        print(f"load average after: {load_average()}")
    print("goal: median and p99 <= 5 ms for scan + predict")
    return 0


if __name__ == "__main__":
    sys.exit(main())
