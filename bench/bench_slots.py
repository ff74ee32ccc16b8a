"""Allocator throughput: 10,000 queued runs over 512 slots (docs/sidecar.md, issue 3).

    python bench/bench_slots.py [--queued 10000] [--decisions 5000] [--baseline-decisions 200] [--seed 0]

The fleet: 64 providers (this server + 63 workers) with 8 CUDA cards each = 512 slots of limit 1.
The queue: 10,000 runs, 70% for one named card, 20% "any CUDA card" (a candidate on every card of
every provider: 512 candidates), 10% device sets of 2-4 cards on one worker. Steady state: one running
run finishes, the dispatcher's decision (plan over the slot state it keeps up to date, then record the
placements) places what it can, a new run is submitted so the queue stays full. Measured: placements
per second of decision time and the latency of each decision, for the indexed, incremental queue the
dispatcher uses (SlotQueue) and, as the baseline in the same process, the reference rule that scans the
whole queue (plan over a list). Both are driven by the same random sequence, so the bench also checks
that they place exactly the same runs on the same devices over the baseline's decisions.
Goals (issue 3), read for the steady state: >= 5,000 placements per second of decision time and p99
decision <= 2 ms. Filling an empty fleet (one decision placing hundreds of runs) is reported too.
"""

from __future__ import annotations

import random
import statistics
import sys
import time
from typing import Any

from benchlib import (  # bench/ (this script's folder) is on sys.path
    against_reference,
    latency_ms,
    print_goals,
    same_placements,
    steady_state_loop,
    verdict,
)

from xpufleet.server.scheduling import (
    Candidate,
    DeviceOffer,
    ProviderInfo,
    QueuedRun,
    SlotQueue,
    build_state,
    plan,
)

PROVIDERS = 64
CARDS = 8


def fleet() -> list[ProviderInfo]:
    provs = [ProviderInfo("local", tuple(DeviceOffer(f"cuda:{i}", uuid=f"GPU-local-{i}") for i in range(CARDS)),
                          is_local=True)]
    for w in range(PROVIDERS - 1):
        provs.append(ProviderInfo(f"w{w:02d}", tuple(DeviceOffer(f"cuda:{i}", uuid=f"GPU-{w}-{i}")
                                                     for i in range(CARDS))))
    return provs


def make_run(rng: random.Random, n: int, provs: list[ProviderInfo]) -> QueuedRun:
    r = rng.random()
    if r < 0.7:
        p = rng.choice(provs)
        return QueuedRun(f"r{n}", (Candidate(p.name, (f"cuda:{rng.randrange(CARDS)}",)),))
    if r < 0.9:
        cands = [Candidate(p.name, (d.name,)) for p in sorted(provs, key=lambda p: (p.is_local, p.name))
                 for d in p.devices]
        return QueuedRun(f"r{n}", tuple(cands))
    p = rng.choice(provs[1:])
    k = rng.randint(2, 4)
    start = rng.randrange(CARDS - k + 1)
    return QueuedRun(f"r{n}", (Candidate(p.name, tuple(f"cuda:{i}" for i in range(start, start + k))),))


def steady_state(use_index: bool, queued: int, decisions: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    provs = fleet()
    q = SlotQueue()
    n = 0
    for _ in range(queued):
        q.add(make_run(rng, n, provs))
        n += 1
    # Like the dispatcher: one slot state, built when providers change, updated as runs start/end;
    # plans make no waiting_reason texts (the dispatcher refreshes those at most twice a second).
    state = build_state(provs)
    reason_ms: list[float] = []
    log: list[tuple[int, str, str, tuple[str, ...]]] = []  # (decision, run, provider, devices)
    looked: list[int] = []

    def decide(i: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        result = q.plan(state, explain=False) if use_index else plan(list(q), state, explain=False)
        for p in result.placements:
            q.remove(p.run_id)
            state.hold(p.run_id, p.provider, p.devices)
        dt = time.perf_counter() - t0
        log.extend((i, p.run_id, p.provider, p.devices) for p in result.placements)
        looked.append(result.examined)
        if len(reason_ms) < 200:
            t1 = time.perf_counter()
            result.reasons()
            reason_ms.append((time.perf_counter() - t1) * 1e3)
        return len(result.placements), dt

    def end_one() -> None:
        if state.held:
            state.release(rng.choice(list(state.held)))

    def refill() -> None:
        nonlocal n
        while len(q) < queued:
            q.add(make_run(rng, n, provs))
            n += 1

    first, first_dt, lat, placed = steady_state_loop(decide, end_one, refill, decisions)
    total = sum(lat)
    return {"first_fill_placements": first, "first_fill_ms": first_dt * 1e3,
            "fill_per_s": first / first_dt, "placements": placed,
            "placements_per_s": placed / total if total else float("inf"), "decisions": decisions,
            **latency_ms(lat), "looked_at": statistics.mean(looked[1:]),
            "reasons_ms": statistics.median(reason_ms), "log": log}


def show(r: dict[str, Any]) -> None:
    print(f"  fill an empty fleet: {r['first_fill_placements']} placements in {r['first_fill_ms']:.1f} ms "
          f"= {r['fill_per_s']:,.0f} placements/s (the rest of the 512 slots are held for waiting sets)")
    print(f"  steady state (one run ends, one decision): {r['placements']} placements in {r['decisions']} "
          f"decisions, {r['placements_per_s']:,.0f} placements/s of decision time; decision mean "
          f"{r['mean_ms']:.3f} ms, p50 {r['p50_ms']:.3f} ms, p99 {r['p99_ms']:.3f} ms, max {r['max_ms']:.3f} ms; "
          f"runs looked at per decision: {r['looked_at']:.1f}")
    print(f"  waiting_reason texts for the runs a decision looked at: {r['reasons_ms']:.3f} ms (median; "
          f"made at most twice a second)")


def main() -> None:
    fleet_text = f"{PROVIDERS} providers x {CARDS} CUDA cards = {PROVIDERS * CARDS} slots (limit 1)"
    labels = ("SlotQueue (what the dispatcher uses)", "reference plan() (baseline)")
    args, fast, base = against_reference(__doc__, 200, fleet_text, "queued runs", steady_state, labels, show)
    same = same_placements(fast, base, args.baseline_decisions)
    print(f"SlotQueue vs baseline: fill {fast['fill_per_s'] / base['fill_per_s']:.1f}x, steady placements/s "
          f"{fast['placements_per_s'] / base['placements_per_s']:.1f}x, steady p99 "
          f"{base['p99_ms'] / fast['p99_ms']:.1f}x lower")
    print_goals("issue 3, SlotQueue", "placements/s of decision time", fast["placements_per_s"], fast["p99_ms"])
    print(f"  (filling an empty fleet: {fast['fill_per_s']:,.0f} placements/s, "
          f"{verdict(fast['fill_per_s'] >= 5000)} against the same 5,000/s)")
    if not same:
        sys.exit("SlotQueue placed differently from the reference rule")


if __name__ == "__main__":
    main()
