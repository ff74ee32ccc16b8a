"""Submitting a 1,000-variant sweep: validation and queueing, no training (issue 15).

    python bench/bench_sweep.py [--variants 1000] [--reps 3]

A real sidecar (`xpufleet start --port 0`, a temporary XPUFLEET_HOME) and a real agent simulating one
CUDA card (`xpufleet agent start --simulate cuda:0=24`), which is stopped once it has connected: the
worker stays known, so runs for it are accepted and wait for it (nothing trains). Then, in the same run:

* baseline: ``--variants`` runs submitted one by one with ``POST /api/runs`` (the same child bodies);
* concurrent: the same runs posted by 16 clients at once (a 201 waits for state.db: group commit);
* sweep: one ``POST /api/sweeps`` of ``--variants`` variants (a 250-point log grid of the learning rate
  x 4 seeds, on samples/mlp_digits.json) for the same worker: every child parsed and checked by the
  dispatcher's own admission, then all written in one transaction and queued in one pass.

Each is timed from the request to its answer; afterwards ``GET /api/runs?status=queued`` must count
every run. Also, in this process (no HTTP): the same sweep for this server's own CPU (target ``local``),
where the dispatcher also validates each child's graph against the node classes.

Goal (issue 15): >= 1,000 runs/s queued for the sweep. Printed, not asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from xpufleet.common.client import Client
from xpufleet.common.runtime_file import read_runtime

GOAL_RUNS_PER_S = 1000.0
CONCURRENT_CLIENTS = 16
GRAPH = json.loads((Path(__file__).resolve().parents[1] / "samples" / "mlp_digits.json").read_text())
CLI = [sys.executable, "-m", "xpufleet.server"]


def sweep_body(variants: int, target: Any) -> dict[str, Any]:
    seeds = 4 if variants % 4 == 0 else 1
    return {"name": "bench", "graph": GRAPH, "objective": {"metric": "val_accuracy"},
            "parameters": {"5.lr": {"low": 1e-5, "high": 0.3, "log": True, "steps": variants // seeds}},
            "seeds": seeds, "set": {"10.location": "run_dir"}, "options": {"target": target},
            "max_runs": variants}


def start_fleet(home: Path) -> tuple[Client, dict[str, str]]:
    env = {**os.environ, "XPUFLEET_HOME": str(home), "XPUFLEET_HEARTBEAT_INTERVAL_S": "1"}
    env.pop("XPUFLEET_RUN_QUEUE_MAX_CONCURRENT", None)
    subprocess.run([*CLI, "start", "--port", "0"], env=env, check=True, capture_output=True, timeout=120)
    info = read_runtime(home)
    client = Client(info["url"], info["token"], timeout=120)
    agent = subprocess.Popen([*CLI, "agent", "start", "--foreground", "--name", "box", "--simulate", "cuda:0=24"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in agent.stdout:  # the agent says so when it is connected
        if "connected to" in line:
            break
    else:
        raise SystemExit("the agent ended before it connected")
    agent.send_signal(signal.SIGTERM)
    agent.wait(60)
    agent.stdout.close()
    return client, env


def time_sweep(client: Client, variants: int) -> tuple[float, str]:
    t0 = time.perf_counter()
    answer = client.request("POST", "/api/sweeps", sweep_body(variants, {"worker": "box", "devices": ["cuda:0"]}))
    dt = time.perf_counter() - t0
    assert answer["n_runs"] == variants, answer
    return dt, answer["sweep_id"]


def time_one_by_one(client: Client, variants: int) -> float:
    from xpufleet.server.sweeps.expand import sweep_child
    from xpufleet.server.sweeps.expand import variants as expand
    from xpufleet.server.sweeps.spec import parse_sweep

    spec = parse_sweep(sweep_body(variants, {"worker": "box", "devices": ["cuda:0"]}))
    bodies = [sweep_child(spec, v) for v in expand(spec)]
    t0 = time.perf_counter()
    for b in bodies:
        client.request("POST", "/api/runs", b)
    return time.perf_counter() - t0


def time_concurrent(client: Client, variants: int, threads: int = CONCURRENT_CLIENTS) -> float:
    """The same children posted by ``threads`` clients at once: each answer waits for its run to be in
    state.db, and the writer's group commit puts those that arrive together in one file transaction."""
    from concurrent.futures import ThreadPoolExecutor

    from xpufleet.server.sweeps.expand import sweep_child
    from xpufleet.server.sweeps.expand import variants as expand
    from xpufleet.server.sweeps.spec import parse_sweep

    spec = parse_sweep(sweep_body(variants, {"worker": "box", "devices": ["cuda:0"]}))
    bodies = [sweep_child(spec, v) for v in expand(spec)]
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda b: client.request("POST", "/api/runs", b), bodies))
    return time.perf_counter() - t0


def in_process_local(variants: int) -> tuple[float, float]:
    """The same sweep for this server's CPU, in this process: (seconds, of which graph validation)."""
    from xpufleet.server.run import validation
    from xpufleet.server.scheduling import DeviceOffer
    from xpufleet.server.sidecar.dispatcher import Dispatcher
    from xpufleet.server.sidecar.store import Store
    from xpufleet.server.sweeps.driver import SweepService

    class Local:  # this server's provider as the dispatcher sees it (nothing is started: no loop runs)
        name, is_local, online, draining = "local", True, True, False

        def devices(self) -> list[DeviceOffer]:
            return [DeviceOffer("cpu", "cpu")]

    home = Path(tempfile.mkdtemp(prefix="xpufleet-bench-sweep-local-"))
    store = Store(home / "state.db")
    try:
        d = Dispatcher(store, home)
        d.register_provider(Local())
        svc = SweepService(store, d)
        spent = [0.0]
        real = validation.validate_report

        def timed(graph: Any, *args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return real(graph, *args, **kwargs)
            finally:
                spent[0] += time.perf_counter() - t

        validation.validate_report = timed
        try:
            t0 = time.perf_counter()
            svc.create(sweep_body(variants, "local"))
            return time.perf_counter() - t0, spent[0]
        finally:
            validation.validate_report = real
    finally:
        store.close()
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--variants", type=int, default=1000, help="variants per sweep (default 1000)")
    ap.add_argument("--reps", type=int, default=3, help="sweeps (and one-by-one batches) timed (default 3)")
    args = ap.parse_args()
    home = Path(tempfile.mkdtemp(prefix="xpufleet-bench-sweep-"))
    client, env = start_fleet(home)
    try:
        sweep_s, base_s, conc_s = [], [], []
        for _ in range(args.reps):  # alternate, so all see the same machine load
            base_s.append(time_one_by_one(client, args.variants))
            dt, sweep_id = time_sweep(client, args.variants)
            sweep_s.append(dt)
            conc_s.append(time_concurrent(client, args.variants))
        queued = client.request("GET", "/api/runs", params={"status": "queued", "limit": 1})["total"]
        assert queued == 3 * args.reps * args.variants, queued
        table = client.request("GET", f"/api/sweeps/{sweep_id}")
        assert len(table["table"]) == args.variants and table["counts"] == {"queued": args.variants}
    finally:
        subprocess.run([*CLI, "stop"], env=env, capture_output=True, timeout=180)
        shutil.rmtree(home, ignore_errors=True)
    local_s, validation_s = in_process_local(args.variants)
    med_sweep, med_base = statistics.median(sweep_s), statistics.median(base_s)
    rate = args.variants / med_sweep
    base_rate = args.variants / med_base
    print(f"{args.variants}-variant sweep for an offline worker's cuda:0 (real sidecar, HTTP), median of {args.reps}:")
    print(f"  POST /api/sweeps:          {med_sweep * 1e3:8.1f} ms  {rate:8.0f} runs/s queued "
          f"(each: {', '.join(f'{s * 1e3:.0f}' for s in sweep_s)} ms)")
    print(f"  baseline POST /api/runs x{args.variants}: {med_base * 1e3:8.1f} ms  {base_rate:8.0f} runs/s  "
          f"(sweep {rate / base_rate:.1f}x)")
    med_conc = statistics.median(conc_s)
    print(f"  POST /api/runs x{args.variants} from {CONCURRENT_CLIENTS} clients at once: {med_conc * 1e3:8.1f} ms  "
          f"{args.variants / med_conc:8.0f} runs/s")
    print(f"  {queued} runs queued in the end, every one counted by GET /api/runs?status=queued")
    print(f"same sweep for this server's CPU, in process (children's graphs validated): {local_s * 1e3:.0f} ms, "
          f"{args.variants / local_s:.0f} runs/s; of which graph validation {validation_s * 1e3:.0f} ms "
          f"({validation_s / args.variants * 1e3:.2f} ms per child)")
    met = rate >= GOAL_RUNS_PER_S
    print(f"goal: >= {GOAL_RUNS_PER_S:,.0f} runs/s queued: {'met' if met else 'NOT met'} ({rate:,.0f} runs/s)")
    print(json.dumps({"variants": args.variants, "sweep_s": sweep_s, "one_by_one_s": base_s, "sweep_runs_per_s": rate,
                      "one_by_one_runs_per_s": base_rate, "concurrent_s": conc_s,
                      "concurrent_runs_per_s": args.variants / med_conc, "local_in_process_s": local_s,
                      "local_validation_s": validation_s}))


if __name__ == "__main__":
    main()
