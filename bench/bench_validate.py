"""Graph validation time for graphs of 100, 1,000 and 10,000 nodes (issue 9).

    python bench/bench_validate.py [--sizes 100,1000,10000] [--reps 7]

What ``POST /api/runs`` does with a graph for this server, timed in this process (median of
``--reps``): the shape and limits check (``parse_run_request``), then validation with the real node
classes (``validate_report``) and, for an invalid graph, building the ComfyUI-shaped answer and
encoding it as JSON. Families, each at every size N (N nodes in all):

* ``chain``: a valid training graph whose N-5 TrainingLoops each train the previous one's model
  (a dependency chain N deep);
* ``wide``: a valid graph whose N-5 TrainingLoops all train the same model (one node, N-5 users);
* ``cycle``: the probe's hang, N TrainingLoops in one ring (node i takes model=[i-1, 0]); every node
  also misses 7 inputs, so 8N problems are found, 100 listed;
* ``no-output``: the probe's stall, N Loss nodes and no output node.

The baseline, measured in the same run: ``json.loads`` of the same graph's text, the least any route
must do with it. Linear growth shows as a steady time per node from 1,000 to 10,000 nodes (the
old search was quadratic: 1,000 ring nodes took 6.3 s and a 49 MB answer, 9,995 never ended).
Goal (issue 9): 10,000 nodes validated in <= 200 ms, in every family. Times are CPU time (the wall
time, printed beside it, also holds the waits for a core on a shared machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

from xpufleet.nodes import NODE_CLASS_MAPPINGS
from xpufleet.server.contracts.runs import EXAMPLE_GRAPH
from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.run.validation import GraphValidationError, validate_report

# The data, model, optimizer and loss nodes of the documented example body (iris, a small MLP)
DATA = {k: v for k, v in EXAMPLE_GRAPH.items() if k in ("1", "2", "3", "4", "5")}


def loop(model: str) -> dict[str, Any]:
    return {"class_type": "XPUTrainingLoop", "inputs": {
        "model": [model, 0], "dataloader": ["2", 0], "optimizer": ["4", 0], "loss": ["5", 0], "epochs": 1,
        "max_steps": 0, "device": "auto", "precision": "fp32", "tensorboard": False, "strategy": "single"}}


def chain(n: int) -> dict[str, Any]:
    g = dict(DATA)
    for i in range(6, n + 1):
        g[str(i)] = loop("3" if i == 6 else str(i - 1))
    return g


def wide(n: int) -> dict[str, Any]:
    g = dict(DATA)
    for i in range(6, n + 1):
        g[str(i)] = loop("3")
    return g


def cycle(n: int) -> dict[str, Any]:
    g = {str(i): {"class_type": "XPUTrainingLoop", "inputs": {"model": [str(i - 1), 0]}} for i in range(n)}
    g["0"]["inputs"]["model"] = [str(n - 1), 0]
    return g


def no_output(n: int) -> dict[str, Any]:
    return {str(i): {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}} for i in range(n)}


FAMILIES = {"chain": chain, "wide": wide, "cycle": cycle, "no-output": no_output}


def submit_path(graph: dict[str, Any]) -> tuple[str, int]:
    """What the sidecar does with the graph: (outcome, bytes of the answer)."""
    req = parse_run_request({"graph": graph})
    try:
        validate_report(req.graph, NODE_CLASS_MAPPINGS).raise_if_invalid()
    except GraphValidationError as exc:
        return exc.response["error"]["type"], len(json.dumps(exc.response))
    return "valid", 0


def median_ms(fn, reps: int) -> tuple[float, float]:
    """(median CPU ms, median wall ms): CPU time is what the work costs; on a shared machine the wall
    time also holds the waits for a core, so the figures and the goal read the CPU time."""
    cpu, wall = [], []
    for _ in range(reps):
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpu.append((time.process_time() - c) * 1000)
        wall.append((time.perf_counter() - w) * 1000)
    return statistics.median(cpu), statistics.median(wall)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,10000", help="graph sizes (nodes), comma-separated")
    ap.add_argument("--reps", type=int, default=7, help="repetitions per measurement (median)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    print("CPU time, median of --reps (wall time in brackets):")
    print(f"{'family':<10} {'nodes':>6} {'outcome':<32} {'answer':>8} {'json.loads':>11} {'validate':>19} "
          f"{'ratio':>6} {'us/node':>8}")
    worst: dict[int, float] = {}
    per_node: dict[tuple[str, int], float] = {}
    for family, make in FAMILIES.items():
        for n in sizes:
            graph = make(n)
            text = json.dumps({"graph": graph})
            outcome, answer = submit_path(graph)
            base, _ = median_ms(lambda text=text: json.loads(text), args.reps)
            took, wall = median_ms(lambda graph=graph: submit_path(graph), args.reps)
            per_node[(family, n)] = took * 1000 / n
            worst[n] = max(worst.get(n, 0.0), took)
            print(f"{family:<10} {n:>6} {outcome:<32} {answer:>7}B {base:>9.2f}ms {took:>8.2f}ms "
                  f"({wall:>6.1f}ms) {took / base:>5.1f}x {took * 1000 / n:>8.2f}")
    if 1000 in sizes and 10_000 in sizes:
        print("growth from 1,000 to 10,000 nodes (time per node at 10,000 / at 1,000; 1.0 = linear):")
        for family in FAMILIES:
            print(f"  {family:<10} {per_node[(family, 10_000)] / per_node[(family, 1000)]:.2f}")
    if 10_000 in sizes:
        ok = worst[10_000] <= 200.0
        print(f"goal (issue 9): 10,000 nodes in <= 200 ms: slowest family {worst[10_000]:.1f} ms CPU, "
              f"{'met' if ok else 'NOT met'}")


if __name__ == "__main__":
    main()
