"""The GPU checks of memory and start-up (docs/gpu-check.md): the allocator cap on a shared card, NVML's
per-process figure, the warm start (no CUDA context outside the runs; submit -> first batch, warm vs cold)
and the default budget after a measured run. Each ``check_*(device, work)`` drives a real sidecar and agent
(gpu_fleet.py) through the HTTP API and the CLI and returns a :class:`gpu_report.Outcome`; ``device`` is
``cuda`` (judged) or ``cpu`` (a dry run on simulated cards, never judged).
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import gpu_report as R
from gpu_fleet import WORKER, GpuFleet, first_ts, harness

from xpufleet.constants import CUDA_CONTEXT_MIB, MEASURED_PEAK_HEADROOM

GIB = 1024**3
FOREVER = 1_000_000  # epochs of a run that lasts until the check cancels it


def graph(hidden: str = "16", epochs: int = 1) -> dict[str, Any]:
    """The test suite's iris graph (TrainingLoop + Evaluate) with an MLP of ``hidden`` units."""
    g = harness().iris_graph(epochs)
    g["4"]["inputs"]["hidden"] = hidden
    return g


# --- 3. the cap: two budgeted runs on one card ----------------------------------------------------------

OVER_BUDGET_GIB = 0.25  # the big MLP's weights alone are ~0.27 GiB (8192 x 8192 floats), Adam triples that
NEIGHBOUR_BUDGET_GIB = 1.0


def check_cap(device: str, work: Path) -> R.Outcome:
    """The neighbour (a small MLP, budget 1 GiB) runs alone first: its final metrics are the reference. Then
    it runs again, and while it trains a big MLP (budget 0.25 GiB) starts on the same card and must fail with
    the out-of-memory text of ``server/ledger/budget.py`` (``oom_message``); the neighbour must succeed with
    the reference's metrics."""
    from xpufleet.server.ledger.budget import USER, Budget, oom_message

    with GpuFleet(work / "home", device) as fleet:
        fleet.agent()
        fleet.share("cuda:0")
        neighbour = graph("32", epochs=400 if device == "cuda" else 60)  # long enough to overlap the big run
        alone = fleet.finish(fleet.submit(neighbour, memory_gib=NEIGHBOUR_BUDGET_GIB), timeout=120)
        if alone["status"] != "succeeded":
            raise RuntimeError(f"the neighbour alone {alone['status']}: {alone.get('error')}")
        second = fleet.submit(neighbour, memory_gib=NEIGHBOUR_BUDGET_GIB)
        fleet.wait_event(second, "metric", timeout=60)  # it trains on the card
        big = fleet.finish(fleet.submit(graph("8192,8192"), memory_gib=OVER_BUDGET_GIB), timeout=90)
        still_running = fleet.run(second)["status"] == "running"
        shared = fleet.finish(second, timeout=120)
    expected = oom_message(Budget(OVER_BUDGET_GIB, USER), f"cuda:0 on {WORKER}")
    diff = R.max_abs_diff(R.metrics_numbers(alone.get("final_metrics")), R.metrics_numbers(shared.get("final_metrics")))
    cap = (big.get("execution_facts") or {}).get("memory_cap") or {}
    figure = {"over_budget_status": big["status"], "over_budget_error": (big.get("error") or "")[:400],
              "expected_prefix": expected, "neighbour_status": shared["status"], "neighbour_metrics_diff": diff,
              "overlapped": still_running, "memory_cap": cap}
    problems = []
    documented = big["status"] == "failed" and (big.get("error") or "").startswith(expected)
    if not documented:
        problems.append(f"the over-budget run {big['status']}: {(big.get('error') or '')[:200]!r}")
    if shared["status"] != "succeeded" or diff > R.RESULT_TOLERANCE:
        problems.append(f"the neighbour {shared['status']}, metrics differ by {diff:.3g}")
    if not still_running:
        problems.append("the neighbour had finished before the over-budget run ended: they did not share the card")
    if device == "cuda" and cap.get("applied") is not True:
        problems.append(f"the allocator cap was not applied: {cap}")
    text = (f"over budget: {big['status']} ({'the documented text' if documented else 'another text'}); "
            f"neighbour: {shared['status']}, metrics differ by {diff:.3g} from its run alone")
    return R.Outcome("cap", R.verdict(device, not problems), figure, text, "; ".join(problems), device=device)


# --- 4. NVML per-process memory vs reserved + the context -----------------------------------------------


def _long_run(fleet: GpuFleet, hidden: str) -> str:
    run_id = fleet.submit(graph(hidden, epochs=FOREVER))
    fleet.wait_event(run_id, "metric", timeout=60)
    return run_id


def check_nvml(device: str, work: Path) -> R.Outcome:
    """A run trains on the card while the agent reads NVML every heartbeat (1 s); after a few heartbeats it
    is cancelled. Its largest NVML figure (``execution_facts.memory_in_use.max``) minus its reserved peak
    (``peak_memory.reserved``) is the CUDA context: it must be >= 0 and within the ledger's allowance."""
    with GpuFleet(work / "home", device) as fleet:
        fleet.agent()
        run_id = _long_run(fleet, "2048,2048")
        if device == "cuda":
            fleet.wait(lambda: ((fleet.run(run_id).get("execution_facts") or {}).get("memory_in_use") or {})
                       .get("max", {}).get("cuda:0"), "an NVML figure for the run", timeout=20)
        time.sleep(3.0)  # a few more heartbeats at the steady state
        fleet.client.cancel(run_id, "the GPU check has its figures")
        run = fleet.finish(run_id, timeout=60)
    use = (run.get("execution_facts") or {}).get("memory_in_use") or {}
    nvml = (use.get("max") or {}).get("cuda:0")
    peak = run.get("peak_memory") or {}
    reserved = (peak.get("reserved") or {}).get("cuda:0")
    context_mib = None if nvml is None or reserved is None else (nvml - reserved) * 1024
    figure = {"nvml_max_gib": nvml, "reserved_peak_gib": reserved, "context_mib": context_mib,
              "allowance_mib": CUDA_CONTEXT_MIB, "peak_kind": peak.get("kind"), "status": run["status"]}
    if device != "cuda":
        # Simulated cards have no NVML figure, and none is made up (server/agent/usage.py).
        text = f"run {run['status']}; NVML figure {'absent' if nvml is None else nvml} on a simulated card"
        return R.Outcome("nvml", "dry", figure, text, device=device)
    if context_mib is None:
        return R.Outcome("nvml", "error", figure, "no figure", f"NVML {nvml}, reserved peak {reserved}", device=device)
    ok = R.within(context_mib, 0.0, float(CUDA_CONTEXT_MIB))
    text = f"NVML {nvml:.3f} GiB - reserved peak {reserved:.3f} GiB = {context_mib:.0f} MiB (allowance {CUDA_CONTEXT_MIB} MiB)"
    return R.Outcome("nvml", R.verdict(device, ok), figure, text, "" if ok else "outside [0, allowance]",
                     device=device)


# --- 5. the warm start ----------------------------------------------------------------------------------


def fleet_processes(fleet: GpuFleet) -> dict[int, str]:
    """Every process of the fleet (sidecar, agents, their forkservers and other children): pid -> role."""
    import psutil

    out: dict[int, str] = {}
    for role, pid in fleet.pids().items():
        out[pid] = role
        try:
            for child in psutil.Process(pid).children(recursive=True):
                out.setdefault(child.pid, f"{role} child: {' '.join(child.cmdline())[:120]}")
        except psutil.Error:
            continue
    return out


def run_processes(fleet: GpuFleet, run_id: str) -> set[int]:
    import psutil

    pids: set[int] = set()
    for ev in fleet.events(run_id):
        if ev["type"] == "run_started":
            pid = int(ev["payload"]["pid"])
            pids.add(pid)
            try:
                pids |= {c.pid for c in psutil.Process(pid).children(recursive=True)}
            except psutil.Error:
                pass
    return pids


def contexts_on_cards(fleet: GpuFleet, run_id: str) -> dict[str, Any]:
    """Who NVML lists on the machine's cards while ``run_id`` trains: the run, and any other process of the
    fleet (sidecar, agent, forkservers: they must hold no CUDA context). Every card is read, so no
    numbering question (CUDA's order vs NVML's) can hide a context."""
    from xpufleet.server.devices.nvml import Nvml

    ours, run = fleet_processes(fleet), run_processes(fleet, run_id)
    nvml = Nvml()
    if not nvml.ok:
        return {"nvml": nvml.reason, "run_pids": sorted(run), "fleet_pids": len(ours)}
    listed: set[int] = set()
    for card in nvml.cards():
        listed |= set(nvml.card_processes(card.index))
    others = {pid: ours[pid] for pid in listed if pid in ours and pid not in run}
    return {"listed": sorted(listed), "run_pids": sorted(run), "run_listed": bool(run & listed),
            "others": {str(k): v for k, v in others.items()}}


def first_batch_s(fleet: GpuFleet, worker: str, n: int) -> list[float]:
    """Submit -> the first ``train_loss_batch`` (the first batch's loss is read: the batch is done), ``n``
    runs one after the other, after one that is not counted (it waits for the forkserver, warms caches)."""
    out = []
    for i in range(n + 1):
        t0 = time.time()
        run_id = fleet.submit(graph(), worker=worker)
        run = fleet.finish(run_id, timeout=90)
        if run["status"] != "succeeded":
            raise RuntimeError(f"a start-up run on {worker} {run['status']}: {run.get('error')}")
        ts = first_ts(fleet.events(run_id), "metric", "train_loss_batch")
        if ts is None:
            raise RuntimeError(f"run {run_id} reported no train_loss_batch")
        if i:
            out.append(ts - t0)
    return out


def check_warm_start(device: str, work: Path) -> R.Outcome:
    """A warm agent: NVML's process list while a run trains (only the run may be there), then submit -> first
    batch for 3 runs; the same for a cold agent (``XPUFLEET_WARM_START=0``). Goal: warm / cold < 1."""
    with GpuFleet(work / "home", device) as fleet:
        fleet.agent(WORKER)
        warm = first_batch_s(fleet, WORKER, 3)
        run_id = _long_run(fleet, "16")
        seen = contexts_on_cards(fleet, run_id)
        fleet.client.cancel(run_id, "the GPU check has its figures")
        fleet.finish(run_id, timeout=60)
        fleet.stop_agent(WORKER)
        fleet.agent("gpu-check-cold", warm=False)
        cold = first_batch_s(fleet, "gpu-check-cold", 3)
    w, c = statistics.median(warm), statistics.median(cold)
    figure = {"warm_s": warm, "cold_s": cold, "warm_median_s": w, "cold_median_s": c, "ratio": R.ratio(w, c),
              "card_processes": seen}
    problems = []
    if not R.finite(figure["ratio"]) or figure["ratio"] >= 1.0:
        problems.append(f"warm {w:.2f} s is not faster than cold {c:.2f} s")
    if device == "cuda":
        if "nvml" in seen:
            problems.append(f"no NVML: {seen['nvml']}")
        elif not seen["run_listed"]:
            problems.append(f"NVML does not list the run (pids {seen['run_pids']}; listed {seen['listed']})")
        elif seen["others"]:
            problems.append(f"CUDA contexts outside the run: {seen['others']}")
    contexts = (seen.get("nvml") or (f"{len(seen['others'])} contexts outside the run" if seen.get("run_listed")
                                     else "the run not listed"))
    text = f"submit -> first batch warm {w:.2f} s, cold {c:.2f} s (warm / cold {figure['ratio']:.2f}); {contexts}"
    if device != "cuda":  # the timing is not judged off the GPU; the run's processes must have been found
        found = "" if seen.get("run_pids") else "the run's processes were not found"
        return R.Outcome("warm_start", "dry", figure, text, found, device=device)
    return R.Outcome("warm_start", R.verdict(device, not problems), figure, text, "; ".join(problems), device=device)


# --- 8. the default budget after one measured run --------------------------------------------------------


def check_default_budget(device: str, work: Path) -> R.Outcome:
    """A run on the exclusive card measures the graph's peak; with the card shared, the same graph without a
    budget must get peak + 20% (``XPUFLEET`` rounds up to 0.01 GiB), name that run, and succeed under it."""
    with GpuFleet(work / "home", device) as fleet:
        fleet.agent()
        g = graph("512,512")
        measured = fleet.finish(fleet.submit(g), timeout=90)
        if measured["status"] != "succeeded":
            raise RuntimeError(f"the measured run {measured['status']}: {measured.get('error')}")
        fleet.share("cuda:0")
        second_id = fleet.submit(g)
        budget = fleet.run(second_id).get("budget") or {}
        second = fleet.finish(second_id, timeout=90)
    peak = (measured.get("memory_peak") or {}).get("gib")
    gib = budget.get("gib")
    expected = None if peak is None else peak * MEASURED_PEAK_HEADROOM
    figure = {"peak_gib": peak, "peak_source": (measured.get("memory_peak") or {}).get("source"), "budget": budget,
              "expected_gib": expected, "second_status": second["status"], "second_error": second.get("error")}
    problems = []
    if expected is None or not R.within(gib, expected, expected + 0.01):
        problems.append(f"budget {gib} GiB, expected peak {peak} + 20% = {expected}")
    if budget.get("from_run") != measured["id"]:
        problems.append(f"the budget names run {budget.get('from_run')}, not the measured {measured['id']}")
    if second["status"] != "succeeded":
        problems.append(f"the run under the default budget {second['status']}: {(second.get('error') or '')[:200]}")
    text = f"peak {peak} GiB -> default budget {gib} GiB ({budget.get('label')}); the run under it {second['status']}"
    return R.Outcome("default_budget", R.verdict(device, not problems), figure, text, "; ".join(problems),
                     device=device)


CHECKS = {"cap": check_cap, "nvml": check_nvml, "warm_start": check_warm_start, "default_budget": check_default_budget}
