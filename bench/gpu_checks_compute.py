"""The GPU checks of computing on the card (docs/gpu-check.md): the TrainingLoop's throughput, real peaks vs
the static estimate, ddp with NCCL vs gloo, the built-in model server. Each ``check_*(device, work)`` runs
the project's own code (the node, ``bench/bench_training.py``'s hand-written loop, the sidecar, an agent,
its run processes, ``predictor/estimate.py``, the model server) and returns a :class:`gpu_report.Outcome`;
``device`` is ``cuda`` (judged against the goal) or ``cpu`` (a dry run on simulated cards, never judged).
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import gpu_report as R
from benchlib import tests_module
from gpu_fleet import ROOT, WORKER, GpuFleet

GIB = 1024**3
MIB = 1024**2
gp = tests_module("graph_parts.py")  # the test suite's graph nodes


# --- 1. TrainingLoop vs the hand-written loop -----------------------------------------------------------


def check_training(device: str, work: Path) -> R.Outcome:
    """bench_training's comparison, small: MLP 256,128 on 20,000 samples, 2 epochs, 5 alternating reps."""
    import bench_training

    sizes = {"samples": 20000, "epochs": 2, "reps": 5} if device == "cuda" else {"samples": 2000, "epochs": 1,
                                                                                 "reps": 2}
    r = bench_training.measure(device=device, **sizes)
    figure = {k: r[k] for k in ("ratio", "paired_ratio", "best_of_ratio", "batches", "loss_hand", "loss_node")}
    figure.update(hand_s=[round(t, 4) for t in r["hand_s"]], node_s=[round(t, 4) for t in r["node_s"]])
    same = math.isclose(r["loss_hand"], r["loss_node"], rel_tol=R.LOSS_RTOL)
    text = (f"node / hand-written samples/s {r['ratio']:.3f} (paired {r['paired_ratio']:.3f}) over {r['batches']} "
            f"batches on {device}; final losses {'agree' if same else 'differ'} (to {R.LOSS_RTOL:g})")
    ok = R.at_least(r["ratio"], R.TRAINING_GOAL) and same
    detail = "" if same else f"the two loops did not train alike: {r['loss_hand']} vs {r['loss_node']}"
    return R.Outcome("training", R.verdict(device, ok), figure, text, detail, device=device)


# --- 2. real peaks vs the static estimate ---------------------------------------------------------------


def estimate_graphs(device: str) -> dict[str, dict[str, Any]]:
    """Every example graph that trains and bench_estimate's larger graphs (a dry run: one of each)."""
    import bench_estimate

    examples, larger = bench_estimate.example_graphs(), bench_estimate.larger_graphs()
    if device != "cuda":
        examples = dict(list(examples.items())[:1])
        larger = {k: v for k, v in larger.items() if k == "cnn_adaptive_rmsprop"}
    return {**examples, **larger}


def check_estimate_peaks(device: str, work: Path) -> R.Outcome:
    """Each graph runs as a real run on the agent's cuda:0 (one at a time: the card is exclusive); its
    ``peak_memory`` (``max_memory_allocated``, ``reserved``: ``max_memory_reserved``) against
    ``estimate_graph(graph).total_bytes``."""
    from xpufleet.predictor.estimate import estimate_graph

    graphs = estimate_graphs(device)
    # Estimated before the fleet starts, so its processes do not eat the estimate's 5 s limit.
    estimates = {name: estimate_graph(g) for name, g in graphs.items()}
    rows: dict[str, dict[str, Any]] = {}
    missed: list[str] = []
    with GpuFleet(work / "home", device) as fleet:
        fleet.agent()
        ids = {name: fleet.submit(g) for name, g in graphs.items()}
        for name in graphs:
            est = estimates[name]
            run = fleet.finish(ids[name], timeout=90)
            peak = run.get("peak_memory") or {}
            allocated = (peak.get("devices") or {}).get("cuda:0")
            reserved = (peak.get("reserved") or {}).get("cuda:0")
            measured = reserved if device == "cuda" else allocated  # dry: the simulated tensor bytes
            row = {"status": run["status"], "estimate_gib": None if est.total_bytes is None else est.total_bytes / GIB,
                   "rough": est.rough, "reasons": list(est.reasons), "allocated_gib": allocated, "reserved_gib": reserved,
                   "peak_kind": peak.get("kind"), "error": run.get("error")}
            row["ratio"] = R.ratio(row["estimate_gib"], measured)
            rows[name] = row
            if run["status"] != "succeeded" or not R.within(row["ratio"], *R.ESTIMATE_RANGE):
                missed.append(name)
    ratios = [f"{n} {r['ratio']:.2f}" for n, r in rows.items()]
    what = "estimate / reserved peak" if device == "cuda" else "estimate / simulated tensor bytes"
    text = f"{what}: {', '.join(ratios)}"
    failed_runs = [n for n, r in rows.items() if r["status"] != "succeeded"]
    if failed_runs:
        return R.Outcome("estimate_peaks", "error", {"graphs": rows}, text,
                         f"runs that did not succeed: {', '.join(failed_runs)}: {rows[failed_runs[0]]['error']}",
                         device=device)
    # A dry run's ratio is against simulated tensor bytes: shown, never judged
    detail = f"outside the range: {', '.join(missed)}" if missed and device == "cuda" else ""
    return R.Outcome("estimate_peaks", R.verdict(device, not missed), {"graphs": rows}, text, detail, device=device)


# --- 6. ddp with NCCL vs gloo ---------------------------------------------------------------------------


def ddp_graph(name: str) -> dict[str, Any]:
    """A small ddp training graph that saves its model (MLP on synthetic data, 8 steps, no dropout)."""
    return {
        "1": gp.dataset("synthetic_classification", val_split=0.0, n_samples=1024, n_features=32, num_classes=4),
        "2": gp.loader("1", batch_size=32), "3": gp.mlp("1", "64,32"), "4": gp.optimizer("sgd", 0.05, 0.0),
        "5": gp.loss(), "6": gp.training_loop("3", "2", "4", "5", max_steps=8, strategy="ddp", seed=0),
        "7": {"class_type": "XPUModelSaver", "inputs": {"model": ["6", 0], "filename": f"models/{name}.safetensors",
                                                        "format": "safetensors", "location": "outputs",
                                                        "overwrite": True}},
    }


def weights_of(path: Path) -> dict[str, list[float]]:
    from safetensors.numpy import load_file

    return {k: v.astype("float64").ravel().tolist() for k, v in load_file(str(path)).items()}


def saved_model(home: Path, name: str) -> Path:
    matches = sorted((home / "outputs").rglob(f"{name}.safetensors"))
    if not matches:
        raise RuntimeError(f"the run saved no {name}.safetensors under {home / 'outputs'}")
    return matches[0]


def _fleet_ddp(device: str, work: Path, cards: int) -> dict[str, Any]:
    """World size ``cards`` through the real launcher: the real cards (NCCL) vs simulated ones (gloo)."""
    home = work / "home"
    with GpuFleet(home, device) as fleet:
        fleet.agent(WORKER, cards)
        fleet.agent("gpu-check-sim", cards, simulate=True)
        devices = [f"cuda:{i}" for i in range(cards)]
        out = {}
        for side, worker in (("card", WORKER), ("gloo", "gpu-check-sim")):
            run = fleet.finish(fleet.submit(ddp_graph(f"ddp_{side}"), devices, worker=worker), timeout=120)
            if run["status"] != "succeeded":
                raise RuntimeError(f"the ddp run on {worker} {run['status']}: {run.get('error')}")
            ddp = (run.get("execution_facts") or {}).get("ddp") or {}
            out[side] = {"backend": ddp.get("backend"), "world_size": ddp.get("world_size"),
                         "weights": weights_of(saved_model(home, f"ddp_{side}"))}
    return out


def _one_rank(backend: str, work: Path) -> dict[str, Any]:
    """World size 1: the ddp TrainingLoop of one process (``python bench/gpu_checks_compute.py ddp1 ...``)."""
    import os

    out = work / f"ddp1-{backend}.json"
    env = {**os.environ, "XPUFLEET_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(Path(__file__)), "ddp1", backend, str(work / f"ddp1-{backend}")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"ddp world size 1 ({backend}) failed: {proc.stderr[-1500:]}")
    return json.loads(out.read_text())


def ddp1_main(backend: str, folder: str) -> int:
    """One ddp rank of world size 1 through the real TrainingLoop and ``DistributedStrategy``: a worker run's
    context with a ddp role (rank 0 of 1, NCCL on cuda:0, or gloo on a simulated card); writes what it
    trained to ``<folder>.json``. The project's launcher never starts ddp for one card (the loop falls back
    to one process), so this is the only way to reach NCCL on a one-GPU machine."""
    from xpufleet.constants import home_dir
    from xpufleet.nodes import runtime
    from xpufleet.server.run.executor import execute_graph

    run_dir = Path(folder)
    run_dir.mkdir(parents=True, exist_ok=True)
    simulated = backend == "gloo"
    role = runtime.DdpRole(rank=0, world_size=1, cards=["cuda:0"], rendezvous=run_dir / "ddp" / "rendezvous",
                           loops=frozenset({"6"}), simulated=simulated)
    facts: dict[str, Any] = {"simulated_devices": ["cuda:0"]} if simulated else {}
    # ddp_unavailable_reason asks a worker run for two cards of one kind before it plans ranks; the role
    # above is what the runner would give rank 0, with one rank.
    ctx = runtime.RunContext(emit=lambda t, p: None, run_dir=run_dir, run_id="gpu-check-ddp1", seed=1,
                             devices=["cuda:0", "cuda:1"], placement="worker", ddp_allowed=True, ddp=role,
                             execution_facts=facts)
    name = f"ddp1_{backend}"
    execute_graph(ddp_graph(name), ctx)
    ddp = facts.get("ddp") or {}
    result = {"backend": ddp.get("backend"), "world_size": ddp.get("world_size"),
              "weights": weights_of(saved_model(home_dir(), name))}
    Path(f"{folder}.json").write_text(json.dumps(result))
    return 0


def check_ddp_nccl(device: str, work: Path) -> R.Outcome:
    """NCCL (on the card) and gloo (simulated cards, on the CPU) train the same graph to the same weights.
    Two or more GPUs: world size 2 through the real sidecar, agent and launcher; one GPU: world size 1."""
    import torch

    cards = torch.cuda.device_count() if device == "cuda" else 1
    if cards >= 2:
        sides = _fleet_ddp(device, work, 2)
        how = "world size 2 through the launcher"
    else:
        sides = {"card": _one_rank("nccl" if device == "cuda" else "gloo", work), "gloo": _one_rank("gloo", work)}
        how = "world size 1 in one process"
    diff = R.max_abs_diff(sides["card"]["weights"], sides["gloo"]["weights"])
    figure = {"how": how, "max_abs_diff": diff, **{f"{s}_{k}": v[k] for s, v in sides.items()
                                                   for k in ("backend", "world_size")}}
    backend_ok = sides["card"]["backend"] == ("nccl" if device == "cuda" else "gloo") \
        and sides["gloo"]["backend"] == "gloo"
    text = (f"max |w_{sides['card']['backend']} - w_gloo| = {diff:.3g} ({how}, world sizes "
            f"{sides['card']['world_size']} and {sides['gloo']['world_size']})")
    detail = "" if backend_ok else f"backends were {sides['card']['backend']} and {sides['gloo']['backend']}"
    return R.Outcome("ddp_nccl", R.verdict(device, backend_ok and diff <= R.WEIGHTS_TOLERANCE), figure, text, detail,
                     device=device)


# --- 7. the built-in model server on cuda ---------------------------------------------------------------


def check_model_server(device: str, work: Path) -> R.Outcome:
    """A one-instance service of a saved MLP on the agent's card answers the example request; the same model
    loaded on the CPU here (the model server's own ``load_stage``) gives the reference probabilities."""
    import torch
    from bench_units import save_model

    from xpufleet.server.units.split import load_stage

    home = work / "home"
    model = home / "outputs" / "models" / "gpu-check-server.safetensors"
    save_model(model)
    request = json.loads((ROOT / "samples" / "serve_mlp_digits.request.json").read_text())
    request = {"inputs": request["inputs"], "output": "probabilities"}
    with GpuFleet(home, device) as fleet:
        fleet.agent()
        fleet.client.request("POST", "/api/services", {
            "name": "gpu-check", "program": {"model": {"path": str(model)}}, "unit": {"size": 1, "guard": False},
            "replicas": 1, "target": {"worker": WORKER, "device": "cuda"}, "routing": {"wait_s": 60}})
        fleet.wait(lambda: fleet.client.request("GET", "/api/services/gpu-check")["state"] == "ready",
                   "the service ready", timeout=120)
        answer = fleet.client.request("POST", "/api/services/gpu-check/infer", copy.deepcopy(request), timeout=60)
    with torch.no_grad():
        stage = load_stage(model, 0, 1)
        x = torch.tensor(request["inputs"], dtype=torch.float32)
        reference = torch.softmax(stage.module(x), dim=-1).tolist()
    diff = R.max_abs_diff({"p": [v for row in answer["outputs"] for v in row]},
                          {"p": [v for row in reference for v in row]})
    served_on = answer.get("device")
    want = "cuda:0" if device == "cuda" else "cpu"
    text = f"max |p_{served_on} - p_cpu| = {diff:.3g} over {len(reference)} requests' rows, served on {served_on}"
    detail = "" if served_on == want else f"the instance computed on {served_on}, not {want}"
    return R.Outcome("model_server", R.verdict(device, served_on == want and diff <= R.SERVER_TOLERANCE),
                     {"max_abs_diff": diff, "served_on": served_on, "rows": len(reference)}, text, detail,
                     device=device)


CHECKS = {"training": check_training, "estimate_peaks": check_estimate_peaks, "ddp_nccl": check_ddp_nccl,
          "model_server": check_model_server}


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "ddp1":
        raise SystemExit(ddp1_main(sys.argv[2], sys.argv[3]))
    raise SystemExit("usage: python bench/gpu_checks_compute.py ddp1 nccl|gloo FOLDER (run by bench/gpu_check.py)")
