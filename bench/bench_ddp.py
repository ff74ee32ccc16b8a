"""ddp TrainingLoop throughput and start-up, against torchrun and against one process (SPEC §4).

In one run on this machine, with the same model (an MLP, the same initial weights), the same data (one
safetensors file), the same per-rank batches (DistributedSampler, same seed) and one thread per process:

* ours: a queued run on a worker agent with 2 simulated cards (a real sidecar, a real agent, rank 0
  and rank 1 as real processes of one launcher group, gloo over loopback): the TrainingLoop's
  samples/s (every rank's samples over the loop's duration) and, per rank, the time from the submit
  request to the end of its first training batch;
* torchrun: ``torchrun --standalone --nproc-per-node 2 bench/torchrun_baseline.py``, a plain DDP
  script: the same figures, start-up measured from launching torchrun; twice: as tutorials write it
  (TensorDataset, default_collate) and with ``--gather`` (each batch read with one index_select, as
  XPU Fleet's datasets do), which isolates the training loop from the data path;
* one process, one thread, the effective batch (2 x the per-rank batch: the same training as ddp).

Repetitions alternate the three; medians are printed, with the final losses (equal for ours and
torchrun when both really trained on the same batches). Goal: ours / torchrun >= 0.95.

    python bench/bench_ddp.py                       # 40,000 samples x 64 features, 2 epochs, 3 reps
    python bench/bench_ddp.py --samples 20000 --reps 5
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
from typing import Any

HERE = Path(__file__).resolve().parent
CLI = [sys.executable, "-m", "xpufleet.server"]
THREADS = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def make_data(path: Path, samples: int, features: int, classes: int) -> None:
    import numpy as np
    from safetensors.numpy import save_file
    from sklearn.datasets import make_classification

    x, y = make_classification(n_samples=samples, n_features=features, n_informative=12, n_redundant=0,
                               n_classes=classes, n_clusters_per_class=1, random_state=0)
    save_file({"x": x.astype(np.float32), "y": y.astype(np.int64)}, str(path))


def graph(data: Path, args: argparse.Namespace) -> dict[str, Any]:
    return {
        "1": {"class_type": "XPUDataset", "inputs": {"name": "safetensors", "path": str(data), "val_split": 0.0,
                                                     "seed": 0, "normalize": "none"}},
        "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["1", 0], "batch_size": args.batch_size,
                                                        "shuffle": True, "num_workers": 0, "drop_last": False}},
        "3": {"class_type": "XPUMLP", "inputs": {"hidden": args.hidden, "activation": "relu", "dropout": 0.0,
                                                 "seed": 0, "dataset_info": ["1", 2]}},
        "4": {"class_type": "XPUOptimizer", "inputs": {"name": "adam", "lr": args.lr, "weight_decay": 0.0,
                                                       "momentum": 0.9}},
        "5": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}},
        "6": {"class_type": "XPUTrainingLoop", "inputs": {
            "model": ["3", 0], "dataloader": ["2", 0], "optimizer": ["4", 0], "loss": ["5", 0],
            "epochs": args.epochs, "max_steps": 0, "device": "auto", "precision": "fp32", "tensorboard": False,
            "strategy": "ddp", "seed": 0}},
    }


class Fleet:
    """A sidecar and one agent with two simulated cards, in a temporary XPUFLEET_HOME."""

    def __init__(self, home: Path) -> None:
        from xpufleet.server.cli.client import Client
        from xpufleet.server.sidecar.runtime_file import read_runtime

        self.env = {**os.environ, "XPUFLEET_HOME": str(home), "XPUFLEET_HEARTBEAT_INTERVAL_S": "1"}
        for key in THREADS:  # the agent's own environment sets none: the ranks get the ddp defaults
            self.env.pop(key, None)
        subprocess.run([*CLI, "start", "--port", "0"], env=self.env, check=True, capture_output=True, timeout=120)
        info = read_runtime(home)
        self.client = Client(info["url"], info["token"], timeout=60)
        self.log = open(home / "agent.log", "ab")  # noqa: SIM115 - closed in stop()
        self.agent = subprocess.Popen([*CLI, "agent", "start", "--foreground", "--name", "bench",
                                       "--simulate", "cuda:0=24,cuda:1=24"], env=self.env, stdout=self.log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.client.request("GET", "/api/workers/bench")["status"] == "Online":
                    return
            except Exception:  # noqa: BLE001 - not connected yet
                pass
            time.sleep(0.2)
        raise SystemExit("the agent did not connect within 120 s")

    def run(self, g: dict[str, Any], seed: int) -> dict[str, Any]:
        submitted = time.time()
        run_id = self.client.submit(g, {"seed": seed, "target": {"worker": "bench", "devices": ["cuda:0", "cuda:1"]}})[
            "run_id"]
        cursor = 0
        while True:
            page = self.client.events(run_id, cursor=cursor, wait=30)
            cursor = page["cursor"]
            if page["done"]:
                break
        run = self.client.run(run_id)
        if run["status"] != "succeeded":
            raise SystemExit(f"the ddp run {run['status']}: {run['error']}")
        facts = run["execution_facts"]
        assert facts["strategy"] == "ddp" and facts["world_size"] == 2, facts
        return {"samples_per_s": run["final_metrics"]["samples_per_s"], "train_loss": run["final_metrics"]["train_loss"],
                "startup": [t - submitted for t in facts["ddp"]["first_batch_at"]]}

    def stop(self) -> None:
        self.agent.terminate()
        try:
            self.agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.agent.kill()
        subprocess.run([*CLI, "stop"], env=self.env, capture_output=True, timeout=120)
        self.log.close()


def baseline(data: Path, args: argparse.Namespace, seed: int, single: bool = False,
             gather: bool = False) -> dict[str, Any]:
    script = [str(HERE / "torchrun_baseline.py"), "--data", str(data), "--hidden", args.hidden,
              "--epochs", str(args.epochs), "--lr", str(args.lr), "--seed", str(seed)]
    if gather or single:
        script.append("--gather")
    if single:
        cmd = [sys.executable, *script, "--single", "--batch-size", str(2 * args.batch_size)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *script,
               "--batch-size", str(args.batch_size)]
    launched = time.time()
    proc = subprocess.run(cmd, env={**os.environ, **THREADS}, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    out["startup"] = [t - launched for t in out["first_batch_at"]]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=40000)
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--hidden", default="256,128")
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    seed = 1234
    home = Path(tempfile.mkdtemp(prefix="xpufleet-bench-ddp-"))
    data = home / "data.safetensors"
    make_data(data, args.samples, args.features, args.classes)
    g = graph(data, args)
    fleet = Fleet(home)
    ours, torchrun, gathered, single = [], [], [], []
    try:
        warm = dict(g, **{"6": {**g["6"], "inputs": {**g["6"]["inputs"], "epochs": 1, "max_steps": 5}}})
        first = fleet.run(warm, seed)  # the agent's first ddp run (its warm-start parent may still be loading)
        for _ in range(args.reps):
            ours.append(fleet.run(g, seed))
            torchrun.append(baseline(data, args, seed))
            gathered.append(baseline(data, args, seed, gather=True))
            single.append(baseline(data, args, seed, single=True))
    finally:
        fleet.stop()
        shutil.rmtree(home, ignore_errors=True)

    def med(runs: list[dict[str, Any]], key: str) -> float:
        return statistics.median(r[key] for r in runs)

    def startup(runs: list[dict[str, Any]]) -> str:
        per_rank = [statistics.median(r["startup"][k] for r in runs) for k in range(2)]
        return ", ".join(f"rank {k} {t:.2f} s" for k, t in enumerate(per_rank))

    batches = args.samples // (2 * args.batch_size) * args.epochs
    print(f"workload: MLP {args.hidden} on {args.samples} samples x {args.features} features, {args.classes} classes, "
          f"batch {args.batch_size} per rank x 2 ranks, {args.epochs} epochs (~{batches} steps), Adam, 1 thread per "
          f"process, gloo on loopback; {args.reps} alternating repetitions (medians)")
    print(f"ours (queued run, 2 simulated cards = 2 CPU processes): {med(ours, 'samples_per_s'):,.0f} samples/s  "
          f"runs {[round(r['samples_per_s']) for r in ours]}")
    print(f"torchrun --nproc-per-node 2 plain DDP script:            {med(torchrun, 'samples_per_s'):,.0f} samples/s  "
          f"runs {[round(r['samples_per_s']) for r in torchrun]}")
    print(f"torchrun, the same script reading batches by gather:    {med(gathered, 'samples_per_s'):,.0f} samples/s  "
          f"runs {[round(r['samples_per_s']) for r in gathered]}")
    print(f"one process, one thread, batch {2 * args.batch_size} (gather):        {med(single, 'samples_per_s'):,.0f} "
          f"samples/s  runs {[round(r['samples_per_s']) for r in single]}")
    for label, base in (("torchrun (tutorial data path)", torchrun), ("torchrun (same data path)", gathered)):
        ratio = med(ours, "samples_per_s") / med(base, "samples_per_s")
        paired = statistics.median(o["samples_per_s"] / t["samples_per_s"] for o, t in zip(ours, base, strict=True))
        print(f"throughput ratio ours / {label}: {ratio:.3f} (goal >= 0.95; median of paired ratios {paired:.3f})")
    print(f"speed-up of 2 ranks over one process with one thread: {med(ours, 'samples_per_s') / med(single, 'samples_per_s'):.2f}x "
          f"(torchrun: {med(torchrun, 'samples_per_s') / med(single, 'samples_per_s'):.2f}x)")
    print(f"submit -> end of the first batch, ours (warm agent): {startup(ours)}; the agent's first ddp run: "
          f"{', '.join(f'rank {k} {t:.2f} s' for k, t in enumerate(first['startup']))}")
    print(f"launch -> end of the first batch, torchrun: {startup(torchrun)}")
    print(f"final train loss (mean over ranks, last epoch): ours {ours[-1]['train_loss']:.6f}, torchrun "
          f"{torchrun[-1]['train_loss']:.6f} / {gathered[-1]['train_loss']:.6f}, one process (batch "
          f"{2 * args.batch_size}) {single[-1]['train_loss']:.6f}")
    print(f"load average during the run: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
