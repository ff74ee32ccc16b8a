"""ddp TrainingLoop throughput against a plain torchrun DDP script, same model, data and batches (docs/ddp.md).

For each model size, in one run on this machine, with the same model (the same spec, the same seed,
so the same initial weights), the same data (one safetensors file), the same per-rank batches
(DistributedSampler, same seed) and one thread per process:

* ours: a queued run on a worker agent with 2 simulated cards (a real sidecar, a real agent, rank 0
  and rank 1 as real processes of one launcher group, gloo over loopback): the TrainingLoop's
  samples/s (every rank's samples over the loop's duration) and, per rank, the time from the submit
  request to the end of its first training batch;
* torchrun: ``torchrun --standalone --nproc-per-node 2 bench/torchrun_baseline.py --gather``, a plain
  DDP script reading each batch with one index_select as XPU Fleet's datasets do (the same data
  path): the same figures.

Repetitions alternate ours and torchrun; the figure is the median of the paired ratios ours /
torchrun (goal >= 0.95). The trained weights of both sides are compared (max abs difference, must be
<= 1e-5: both really trained the same batches). The load average is printed before the run starts;
above 1.0 the run is labelled "under load", never "quiet". ``--extra`` adds the tutorial data path
(TensorDataset + default_collate) and one process of the effective batch; ``--profile`` adds one
py-spy-profiled run of each side and prints the per-step table (bench/ddp_profile.py).

    python bench/bench_ddp.py                        # all three sizes, 5 alternating repetitions
    python bench/bench_ddp.py --model small --reps 7 --profile
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import ddp_profile  # noqa: E402 - bench/ is not a package

from xpufleet.constants import TERMINAL_STATUSES  # noqa: E402

CLI = [sys.executable, "-m", "xpufleet.server"]
THREADS = {"OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
AGENT = "bench"
TOLERANCE = 1e-5
QUIET_LOAD = 1.0


@dataclass(frozen=True)
class Size:
    """One model size of the bench: its data, its builder node and how long it trains."""

    name: str
    what: str
    samples: int  # synthetic samples (the digits have their own 1,797)
    epochs: int
    builder: str  # XPUMLP | XPUCNN
    hidden: str = ""
    channels: str = ""


SIZES = {
    "small": Size("small", "MLP 64-256-128-10 (~51 k parameters), 40,000 synthetic samples x 64 features",
                  40000, 2, "XPUMLP", hidden="256,128"),
    "mlp10m": Size("mlp10m", "MLP 64-3072-3072-10 (~9.7 M parameters), 6,144 synthetic samples x 64 features",
                   6144, 2, "XPUMLP", hidden="3072,3072"),
    "cnn": Size("cnn", "CNN 16,32 channels (BatchNorm) on the digits as 1x8x8 images, 1,797 samples",
                0, 24, "XPUCNN", channels="16,32"),
}


def make_data(path: Path, size: Size) -> None:
    """The size's data as one safetensors file (x float32, y int64)."""
    import numpy as np
    from safetensors.numpy import save_file
    from sklearn.datasets import load_digits, make_classification

    if size.builder == "XPUCNN":
        digits = load_digits()
        x, y = digits.images.reshape(-1, 1, 8, 8) / 16.0, digits.target
    else:
        x, y = make_classification(n_samples=size.samples, n_features=64, n_informative=12, n_redundant=0,
                                   n_classes=10, n_clusters_per_class=1, random_state=0)
    save_file({"x": x.astype(np.float32), "y": y.astype(np.int64)}, str(path))


def model_spec(size: Size, data: Path) -> dict[str, Any]:
    """The spec the graph's builder node makes for this data: what the torchrun script builds too."""
    from xpufleet.nodes import NODE_CLASS_MAPPINGS as N
    from xpufleet.nodes.models import spec_of

    _train, _val, info = N["XPUDataset"]().load(**dataset_inputs(data))
    if size.builder == "XPUCNN":
        (model,) = N["XPUCNN"]().build(size.channels, 3, "relu", 0.0, 0, dataset_info=info)
    else:
        (model,) = N["XPUMLP"]().build(size.hidden, "relu", 0.0, 0, dataset_info=info)
    return spec_of(model)


def dataset_inputs(data: Path) -> dict[str, Any]:
    return {"name": "safetensors", "path": str(data), "val_split": 0.0, "seed": 0, "normalize": "none"}


def graph(size: Size, data: Path, args: argparse.Namespace) -> dict[str, Any]:
    model = ({"channels": size.channels, "kernel_size": 3} if size.builder == "XPUCNN" else {"hidden": size.hidden})
    return {
        "1": {"class_type": "XPUDataset", "inputs": dataset_inputs(data)},
        "2": {"class_type": "XPUDataLoader", "inputs": {"dataset": ["1", 0], "batch_size": args.batch_size,
                                                        "shuffle": True, "num_workers": 0, "drop_last": False}},
        "3": {"class_type": size.builder, "inputs": {**model, "activation": "relu", "dropout": 0.0, "seed": 0,
                                                     "dataset_info": ["1", 2]}},
        "4": {"class_type": "XPUOptimizer", "inputs": {"name": "adam", "lr": args.lr, "weight_decay": 0.0,
                                                       "momentum": 0.9}},
        "5": {"class_type": "XPULoss", "inputs": {"name": "cross_entropy"}},
        "6": {"class_type": "XPUTrainingLoop", "inputs": {
            "model": ["3", 0], "dataloader": ["2", 0], "optimizer": ["4", 0], "loss": ["5", 0],
            "epochs": size.epochs, "max_steps": 0, "device": "auto", "precision": "fp32", "tensorboard": False,
            "strategy": "ddp", "seed": 0}},
        "7": {"class_type": "XPUModelSaver", "inputs": {"model": ["6", 0], "filename": "model.safetensors",
                                                        "format": "safetensors", "location": "run_dir"}},
    }


class Fleet:
    """A sidecar and one agent with two simulated cards, in a temporary XPUFLEET_HOME."""

    def __init__(self, home: Path) -> None:
        from xpufleet.common.client import Client
        from xpufleet.common.runtime_file import read_runtime

        self.home = home
        # the agent's default heartbeat (10 s): the control plane's CPU during a run is part of what is measured
        self.env = {**os.environ, "XPUFLEET_HOME": str(home)}
        self.env.pop("XPUFLEET_HEARTBEAT_INTERVAL_S", None)
        for key in THREADS:  # the agent's own environment sets none: the ranks get the ddp defaults
            self.env.pop(key, None)
        subprocess.run([*CLI, "start", "--port", "0"], env=self.env, check=True, capture_output=True, timeout=120)
        info = read_runtime(home)
        self.sidecar_pid = int(info["pid"])
        self.client = Client(info["url"], info["token"], timeout=60)
        self.log = open(home / "agent.log", "ab")  # noqa: SIM115 - closed in stop()
        self.agent = subprocess.Popen([*CLI, "agent", "start", "--foreground", "--name", AGENT,
                                       "--simulate", "cuda:0=24,cuda:1=24"], env=self.env, stdout=self.log,
                                      stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.client.request("GET", f"/api/workers/{AGENT}")["status"] == "Online":
                    return
            except Exception:  # noqa: BLE001 - not connected yet
                pass
            time.sleep(0.2)
        raise SystemExit("the agent did not connect within 120 s")

    def control_plane_cpu_s(self) -> float:
        """CPU seconds the sidecar and the agent processes (not their children: the ranks) have used."""
        import psutil

        return sum(sum(psutil.Process(pid).cpu_times()[:2]) for pid in (self.sidecar_pid, self.agent.pid))

    def run(self, g: dict[str, Any], seed: int) -> dict[str, Any]:
        submitted = time.time()
        cpu0 = self.control_plane_cpu_s()
        run_id = self.client.submit(g, {"seed": seed, "target": {"worker": AGENT, "devices": ["cuda:0", "cuda:1"]}})[
            "run_id"]
        while True:  # the run's status once a second, not its event stream: the bench client stays idle
            run = self.client.run(run_id)
            if run["status"] in TERMINAL_STATUSES:
                break
            time.sleep(1.0)
        cpu = self.control_plane_cpu_s() - cpu0
        if run["status"] != "succeeded":
            raise SystemExit(f"the ddp run {run['status']}: {run['error']}")
        facts = run["execution_facts"]
        assert facts["strategy"] == "ddp" and facts["world_size"] == 2, facts
        fm = run["final_metrics"]
        return {"samples_per_s": fm["samples_per_s"], "train_loss": fm["train_loss"], "control_cpu_s": cpu,
                "duration_s": time.time() - submitted,
                "startup": [t - submitted for t in facts["ddp"]["first_batch_at"]],
                "threads": [r.get("threads") for r in facts["ddp"]["ranks"]], "epoch_s": facts["epoch_s"],
                "epoch_cpu_s": facts["epoch_cpu_s"],
                "weights": self.home / "agents" / AGENT / "runs" / run_id / "model.safetensors"}

    def stop(self) -> None:
        self.agent.terminate()
        try:
            self.agent.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.agent.kill()
        subprocess.run([*CLI, "stop"], env=self.env, capture_output=True, timeout=120)
        self.log.close()


def baseline(work: Path, size: Size, args: argparse.Namespace, seed: int, *, gather: bool = True,
             single: bool = False, wrap: Any = None) -> dict[str, Any]:
    """One torchrun (or ``single``: one process) run of bench/torchrun_baseline.py."""
    weights = work / f"torchrun-{time.monotonic_ns()}.safetensors"
    script = [str(HERE / "torchrun_baseline.py"), "--data", str(work / "data.safetensors"),
              "--spec", str(work / "spec.json"), "--epochs", str(size.epochs), "--lr", str(args.lr),
              "--seed", str(seed), "--save", str(weights)]
    if gather or single:
        script.append("--gather")
    if single:
        cmd = [sys.executable, *script, "--single", "--batch-size", str(2 * args.batch_size)]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", *script,
               "--batch-size", str(args.batch_size)]
    launched = time.time()
    proc = subprocess.run(wrap(cmd) if wrap else cmd, env={**os.environ, **THREADS}, capture_output=True,
                          text=True, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    out = json.loads([line for line in proc.stdout.splitlines() if line.startswith("{")][-1])
    out["startup"] = [t - launched for t in out["first_batch_at"]]
    out["weights"] = weights
    return out


def max_abs_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    x, y = load_file(str(a)), load_file(str(b))
    if x.keys() != y.keys():
        raise SystemExit(f"the trained models differ in their tensors: {sorted(x)} vs {sorted(y)}")
    return max(float((x[k].double() - y[k].double()).abs().max()) for k in x)


def steps(size: Size, batch_size: int) -> int:
    """Optimizer steps of a run: DistributedSampler gives each of 2 ranks ceil(N / 2) samples per epoch."""
    n = 1797 if size.builder == "XPUCNN" else size.samples
    return math.ceil(math.ceil(n / 2) / batch_size) * size.epochs


def steady_s(run: dict[str, Any]) -> float:
    """Seconds of a run's epochs after the first (rank 0's clock; both sides time epochs alike)."""
    return sum(run["epoch_s"][1:])


def step_us(samples_per_s: float, batch_size: int) -> float:
    """Wall time of one optimizer step of both ranks (2 x batch_size samples), in microseconds."""
    return 2 * batch_size / samples_per_s * 1e6


def profile(fleet: Fleet, g: dict[str, Any], work: Path, size: Size, args: argparse.Namespace, seed: int,
            ours_us: float, torchrun_us: float) -> str:
    """One py-spy-profiled run of each side: the per-step table (shares of the profiled runs scaled to
    the unprofiled medians)."""
    if not ddp_profile.Recorder.available():
        return "(--profile: py-spy is not installed; pip install py-spy)"
    rec = ddp_profile.Recorder(work / "ours.pyspy")
    rec.attach(fleet.agent.pid)
    time.sleep(1.0)  # py-spy attaches before the run's ranks fork
    fleet.run(g, seed)
    ours = ddp_profile.shares(rec.stop(), ddp_profile.OURS_LOOP)
    out = work / "torchrun.pyspy"
    baseline(work, size, args, seed, wrap=ddp_profile.Recorder(out).wrap)
    theirs = ddp_profile.shares(out.read_text(), ddp_profile.TORCHRUN_LOOP)
    return ddp_profile.table({"ours": (*ours, ours_us), "torchrun (same data path)": (*theirs, torchrun_us)})


def bench_size(fleet: Fleet, size: Size, args: argparse.Namespace, seed: int) -> bool:
    """Alternating repetitions of one size; prints its figures; True when the weights agree."""
    work = Path(tempfile.mkdtemp(prefix=f"xpufleet-bench-ddp-{size.name}-"))
    try:
        data = work / "data.safetensors"
        make_data(data, size)
        (work / "spec.json").write_text(json.dumps(model_spec(size, data)))
        g = graph(size, data, args)
        warm = json.loads(json.dumps(g))
        warm["6"]["inputs"].update(epochs=1, max_steps=3)
        first = fleet.run(warm, seed)  # the agent's first ddp run of this size (its warm-start parent may load)
        ours: list[dict[str, Any]] = []
        runs: dict[str, list[dict[str, Any]]] = {"torchrun (same data path)": []}
        if args.extra:
            runs.update({"torchrun (tutorial data path)": [], "one process, batch x2": []})
        for rep in range(args.reps):
            # alternate which side goes first, so a slow phase of the machine hits both alike
            order = ["ours", *runs] if rep % 2 == 0 else [*runs, "ours"]
            for side in order:
                if side == "ours":
                    ours.append(fleet.run(g, seed))
                else:
                    runs[side].append(baseline(work, size, args, seed, gather="tutorial" not in side,
                                               single=side.startswith("one")))
        same = runs["torchrun (same data path)"]
        diff = max(max_abs_diff(o["weights"], t["weights"]) for o, t in zip(ours, same, strict=True))
        report(size, args, ours, runs, first, diff)
        if args.profile:
            med_o = statistics.median(step_us(r["samples_per_s"], args.batch_size) for r in ours)
            med_t = statistics.median(step_us(r["samples_per_s"], args.batch_size) for r in same)
            print(profile(fleet, g, work, size, args, seed, med_o, med_t))
        return diff <= TOLERANCE
    finally:
        shutil.rmtree(work, ignore_errors=True)


def report(size: Size, args: argparse.Namespace, ours: list[dict[str, Any]], runs: dict[str, list[dict[str, Any]]],
           first: dict[str, Any], diff: float) -> None:
    def med(rs: list[dict[str, Any]]) -> float:
        return statistics.median(r["samples_per_s"] for r in rs)

    def startup(rs: list[dict[str, Any]]) -> str:
        return ", ".join(f"rank {k} {statistics.median(r['startup'][k] for r in rs):.2f} s" for k in range(2))

    print(f"\n== {size.name}: {size.what}; batch {args.batch_size} per rank x 2 ranks, {size.epochs} epoch(s), "
          f"{steps(size, args.batch_size)} steps, Adam, gloo on loopback, {args.reps} alternating repetitions")
    print(f"ours (queued run, 2 simulated cards = 2 CPU processes): {med(ours):,.0f} samples/s "
          f"({step_us(med(ours), args.batch_size):,.0f} us/step)  runs {[round(r['samples_per_s']) for r in ours]}")
    for name, rs in runs.items():
        print(f"{name + ':':55s} {med(rs):,.0f} samples/s ({step_us(med(rs), args.batch_size):,.0f} us/step)  "
              f"runs {[round(r['samples_per_s']) for r in rs]}")
    for name, rs in runs.items():
        if name.startswith("torchrun"):
            paired = [o["samples_per_s"] / t["samples_per_s"] for o, t in zip(ours, rs, strict=True)]
            print(f"ours / {name}: median of paired ratios {statistics.median(paired):.3f} (goal >= 0.95); "
                  f"pairs {[round(p, 3) for p in paired]}")
            if size.epochs > 1:  # the per-step cost, without the first epoch's one-off costs (either side)
                steady = [steady_s(t) / steady_s(o) for o, t in zip(ours, rs, strict=True)]
                first_epoch = [t["epoch_s"][0] / o["epoch_s"][0] for o, t in zip(ours, rs, strict=True)]
                print(f"  after the first epoch (epochs 2-{size.epochs}): median of paired ratios "
                      f"{statistics.median(steady):.3f}; pairs {[round(p, 3) for p in steady]}; "
                      f"first epoch alone: {statistics.median(first_epoch):.3f}")
    if size.epochs > 1:  # CPU, unlike wall time, hardly moves with what else the machine runs
        same = runs["torchrun (same data path)"]
        cpu = [sum(o["epoch_cpu_s"][1:]) / sum(t["epoch_cpu_s"][1:]) for o, t in zip(ours, same, strict=True)]
        print(f"  rank 0's CPU seconds in epochs 2-{size.epochs}, ours / torchrun: median {statistics.median(cpu):.3f}; "
              f"pairs {[round(c, 3) for c in cpu]}")
    share = sum(r["control_cpu_s"] for r in ours) / sum(r["duration_s"] for r in ours)
    print(f"sidecar + agent CPU during ours' runs: {share:.1%} of one core (submit to finish)")
    print(f"torch threads per process: ours {ours[-1]['threads']}, torchrun "
          f"{runs['torchrun (same data path)'][-1]['threads']}")
    print(f"weights after training, ours vs torchrun: max abs difference {diff:.3g} "
          f"({'ok' if diff <= TOLERANCE else 'FAIL'}: tolerance {TOLERANCE:g})")
    print(f"submit -> end of the first batch, ours (warm agent): {startup(ours)}; the agent's first ddp run: "
          f"{', '.join(f'rank {k} {t:.2f} s' for k, t in enumerate(first['startup']))}; launch -> first batch, "
          f"torchrun: {startup(runs['torchrun (same data path)'])}")
    print(f"final train loss: ours {ours[-1]['train_loss']:.6f}, torchrun "
          f"{runs['torchrun (same data path)'][-1]['train_loss']:.6f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=[*SIZES, "all"], default="all")
    ap.add_argument("--batch-size", type=int, default=64, help="per rank")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--reps", type=int, default=5, help="alternating repetitions (>= 5 for the goal's figure)")
    ap.add_argument("--extra", action="store_true", help="also the tutorial data path and one process")
    ap.add_argument("--profile", action="store_true", help="also one py-spy-profiled run each: per-step table")
    args = ap.parse_args()
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    load = os.getloadavg()
    cores = len(os.sched_getaffinity(0))
    label = "quiet" if load[0] <= QUIET_LOAD else "under load"
    print(f"load average before the run: {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} on {cores} cores "
          f"({os.cpu_count()} CPUs): this run is {label!r}{'' if label == 'quiet' else f' (quiet = <= {QUIET_LOAD})'}; "
          f"1 torch thread per process (OMP_NUM_THREADS=1)")
    seed = 1234
    home = Path(tempfile.mkdtemp(prefix="xpufleet-bench-ddp-"))
    fleet = Fleet(home)
    ok = True
    try:
        for name in (SIZES if args.model == "all" else [args.model]):
            ok = bench_size(fleet, SIZES[name], args, seed) and ok
    finally:
        fleet.stop()
        shutil.rmtree(home, ignore_errors=True)
    end = os.getloadavg()
    print(f"\nload average after the run: {end[0]:.2f} {end[1]:.2f} {end[2]:.2f}; the run was {label!r}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
