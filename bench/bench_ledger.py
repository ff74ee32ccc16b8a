"""Memory admission throughput: 10,000 waiting budgeted runs over 64 shared cards (docs/memory.md, issue 12).

    python bench/bench_ledger.py [--queued 10000] [--decisions 5000] [--baseline-decisions 100] [--seed 0]

The fleet: 8 workers with 8 CUDA cards each, all shared by memory (4 workers of 80 GiB cards, 4 of
48 GiB), a 768 MiB CUDA context per run. The queue: 10,000 budgeted runs (2 to 40 GiB per card), 70% for
one named card, 20% "any card" (64 candidates), 10% device sets of 2-4 cards on one worker. Steady state:
one running run ends, its worker's heartbeat reports the card's free memory (what the runs on it use
plus up to 2 GiB of other users' processes), the admission decision places what now fits (reserved on
the ledger; a run overtaken three times on a card holds it, as in the dispatcher) and the placed runs
start; new submissions keep the queue full. Each new submission also gets the submit-time decision
(admit / wait / reject with its text), measured separately.

Measured: decisions per second and placements per second of decision time, and the latency of each
decision, for the incremental MemoryQueue and, as the baseline in the same process, the reference rule
that walks the whole queue (plan_reference). Both are driven by the same random sequence, and the bench
checks that they place exactly the same runs on the same cards over the baseline's decisions.
Goals (issue 12), read for the steady state: >= 5,000 decisions per second and p99 decision <= 2 ms.
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
    pct,
    print_goals,
    same_placements,
    steady_state_loop,
)

from xpufleet.server.ledger.fit import Ledger
from xpufleet.server.ledger.queue import MemoryHolds, MemoryQueue, MemoryRun, plan_reference

WORKERS = 8
CARDS = 8
BUDGETS = (2, 3, 4, 6, 8, 12, 16, 24, 40)


def fleet() -> list[tuple[str, str, float]]:
    return [(f"GPU-w{w}-{i}", f"cuda:{i} on w{w}", 80.0 if w < 4 else 48.0) for w in range(WORKERS)
            for i in range(CARDS)]


def make_run(rng: random.Random, n: int, cards: list[tuple[str, str, float]]) -> tuple[MemoryRun, bool]:
    """A run and whether it names its worker."""
    budget = float(rng.choice(BUDGETS))
    r = rng.random()
    if r < 0.7:
        return MemoryRun(f"r{n:07d}", budget, ((rng.choice(cards)[0],),)), True
    if r < 0.9:
        return MemoryRun(f"r{n:07d}", budget, tuple((c[0],) for c in cards)), False
    w = rng.randrange(WORKERS)
    k = rng.randint(2, 4)
    start = rng.randrange(CARDS - k + 1)
    return MemoryRun(f"r{n:07d}", budget, ((*(f"GPU-w{w}-{i}" for i in range(start, start + k)),),)), True


def steady_state(incremental: bool, queued: int, decisions: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    cards = fleet()
    totals = {key: total for key, _, total in cards}
    ledger = Ledger()
    for key, label, total in cards:
        ledger.set_card(key, label, "cuda", total_gib=total, free_gib=total)
    queue = MemoryQueue(ledger)
    ref_holds = MemoryHolds()  # the anti-starvation holds, kept the same way by the baseline
    waiting: list[MemoryRun] = []  # the baseline's queue in submission order
    n = 0
    submit_ms: list[float] = []
    verdicts: dict[str, int] = {}

    def submit() -> None:
        nonlocal n
        run, named = make_run(rng, n, cards)
        n += 1
        t0 = time.perf_counter()
        decision = ledger.decide(run.budget_gib, run.candidates, named=named, wait=True)
        if decision.action == "wait":
            decision.message  # noqa: B018 - the text is part of the decision's cost
        submit_ms.append((time.perf_counter() - t0) * 1e3)
        verdicts[decision.action] = verdicts.get(decision.action, 0) + 1
        if incremental:
            queue.add(run)
        else:
            waiting.append(run)

    for _ in range(queued):
        submit()
    running: list[str] = []
    log: list[tuple[int, str, tuple[str, ...]]] = []

    def heartbeat(key: str) -> None:
        card = ledger.cards[key]
        used = card.running_sum + rng.uniform(0, 2) * 1024**3  # the runs' use and other users' processes
        ledger.report(key, totals[key], max(0.0, (totals[key] * 1024**3 - used) / 1024**3))

    def decide(i: int) -> tuple[int, float]:
        t0 = time.perf_counter()
        if incremental:
            placed = queue.plan()
        else:
            placed = plan_reference(waiting, ledger, ref_holds)
            gone = {p.run_id for p in placed}
            waiting[:] = [r for r in waiting if r.run_id not in gone]
        for p in placed:
            ledger.start(p.run_id)
        dt = time.perf_counter() - t0
        running.extend(p.run_id for p in placed)
        log.extend((i, p.run_id, p.keys) for p in placed)
        return len(placed), dt

    def end_one() -> None:  # and its cards' heartbeats
        if running:
            run_id = running.pop(rng.randrange(len(running)))
            keys = ledger.runs[run_id].keys
            ledger.release(run_id)
            for key in keys:
                heartbeat(key)

    def refill() -> None:
        while (len(queue) if incremental else len(waiting)) < queued:
            submit()

    first, first_dt, lat, placed = steady_state_loop(decide, end_one, refill, decisions)
    total = sum(lat)
    holds = queue.holds if incremental else ref_holds
    return {"holds": len(holds.by_key), "first": first, "first_ms": first_dt * 1e3, "decisions": decisions,
            "placements": placed,
            "decisions_per_s": decisions / total, "placements_per_s": placed / total,
            **latency_ms(lat), "submit_p50_ms": statistics.median(submit_ms),
            "submit_p99_ms": pct(submit_ms, 0.99), "submit_per_s": len(submit_ms) / (sum(submit_ms) / 1e3),
            "verdicts": verdicts, "running": len(running), "log": log}


def show(r: dict[str, Any]) -> None:
    print(f"  fill an empty fleet: {r['first']} placements in {r['first_ms']:.1f} ms")
    print(f"  steady state (a run ends, a heartbeat, one decision): {r['decisions']} decisions placing "
          f"{r['placements']} runs; {r['decisions_per_s']:,.0f} decisions/s, {r['placements_per_s']:,.0f} "
          f"placements/s of decision time; decision mean {r['mean_ms']:.3f} ms, p50 {r['p50_ms']:.3f} ms, "
          f"p99 {r['p99_ms']:.3f} ms, max {r['max_ms']:.3f} ms; {r['running']} runs on the cards at the end, "
          f"{r['holds']} cards held for an overtaken run")


def main() -> None:
    fleet_text = f"{WORKERS} workers x {CARDS} CUDA cards shared by memory = {WORKERS * CARDS} cards (80 and 48 GiB)"
    labels = ("MemoryQueue (incremental)", "plan_reference (walks the whole queue, baseline)")
    args, fast, base = against_reference(__doc__, 100, fleet_text, "waiting budgeted runs", steady_state, labels, show)
    print(f"submit-time decisions (ledger.decide with the text): {fast['submit_per_s']:,.0f}/s, p50 "
          f"{fast['submit_p50_ms']:.4f} ms, p99 {fast['submit_p99_ms']:.4f} ms; verdicts {fast['verdicts']}")
    same = same_placements(fast, base, args.baseline_decisions)
    print(f"MemoryQueue vs baseline: decisions/s {fast['decisions_per_s'] / base['decisions_per_s']:.0f}x, "
          f"p99 {base['p99_ms'] / fast['p99_ms']:.0f}x lower")
    print_goals("issue 12, MemoryQueue", "decisions/s", fast["decisions_per_s"], fast["p99_ms"])
    if not same:
        sys.exit("MemoryQueue placed differently from the reference rule")


if __name__ == "__main__":
    main()
