"""What the benchmarks share: the test suite's helpers (:func:`tests_module`), and what the scheduler
benchmarks (bench_slots.py, bench_ledger.py, bench_submit_latency.py) measure alike: the percentile, the
decision-latency figures, the verdict word and the queue benchmarks' arguments.
Imported by name: a benchmark runs as ``python bench/<name>.py``, so this folder is on ``sys.path``."""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

TESTS = Path(__file__).resolve().parents[1] / "tests"


def tests_module(path: str) -> ModuleType:
    """``tests/<path>`` (``graph_parts.py``, ``server/sidecar_harness.py``, ...) imported by path under its
    file's name, after the helpers the test modules import by name (``graph_parts``, ``processes``), as
    tests/conftest.py registers them: the test folders are not packages."""
    for rel in ("graph_parts.py", "processes.py", path):
        name = Path(rel).stem
        if name not in sys.modules:
            spec = importlib.util.spec_from_file_location(name, TESTS / rel)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    return sys.modules[Path(path).stem]


def pct(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values``: the value at index ``int(q * n)`` of the sorted list."""
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def latency_ms(lat: list[float]) -> dict[str, float]:
    """p50, p99, max and mean of latencies in seconds, in milliseconds."""
    return {"p50_ms": statistics.median(lat) * 1e3, "p99_ms": pct(lat, 0.99) * 1e3, "max_ms": max(lat) * 1e3,
            "mean_ms": sum(lat) / len(lat) * 1e3}


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def queue_arguments(description: str | None, baseline_decisions: int) -> argparse.Namespace:
    """The arguments of a queue benchmark: how many queued runs, how many steady-state decisions (and
    how many for the reference baseline, which walks the whole queue), the random seed."""
    ap = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queued", type=int, default=10_000)
    ap.add_argument("--decisions", type=int, default=5_000)
    ap.add_argument("--baseline-decisions", type=int, default=baseline_decisions)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def steady_state_loop(decide: Callable[[int], tuple[int, float]], end_one: Callable[[], None],
                      refill: Callable[[], None], decisions: int) -> tuple[int, float, list[float], int]:
    """The loop both queue benchmarks drive: an empty fleet fills up (``decide(-1)``), then ``decisions``
    times a run ends (``end_one``), one decision places what it can (``decide(i)``: placements, seconds)
    and new submissions keep the queue full (``refill``). Returns the fill's placements and seconds, each
    steady decision's seconds, and the steady placements."""
    first, first_dt = decide(-1)
    lat: list[float] = []
    placed = 0
    for i in range(decisions):
        end_one()
        k, dt = decide(i)
        lat.append(dt)
        placed += k
        refill()
    return first, first_dt, lat, placed


Result = dict[str, Any]


def against_reference(description: str | None, baseline_decisions: int, fleet: str, runs: str,
                      steady_state: Callable[..., Result], labels: tuple[str, str],
                      show: Callable[[Result], None]) -> tuple[argparse.Namespace, Result, Result]:
    """A queue benchmark's run: its arguments (:func:`queue_arguments`), the ``fleet`` and the ``runs`` that
    wait (both benchmarks draw the same mix of targets), then ``steady_state(incremental, queued, decisions,
    seed)`` for the structure under test and for the reference rule (the baseline: ``--baseline-decisions``),
    driven by the same random sequence, each printed under its label by ``show``. Returns the arguments and
    both results."""
    args = queue_arguments(description, baseline_decisions)
    print(f"fleet: {fleet}; {args.queued} {runs} (70% one card, 20% any card, 10% sets of 2-4)")
    fast = steady_state(True, args.queued, args.decisions, args.seed)
    base = steady_state(False, args.queued, args.baseline_decisions, args.seed)
    for label, r in zip(labels, (fast, base), strict=True):
        print(f"{label}:")
        show(r)
    return args, fast, base


def same_placements(fast: Result, base: Result, upto: int) -> bool:
    """Whether both placed the same runs on the same devices over the fill and ``upto`` steady decisions
    (their ``log`` rows start with the decision's number); printed."""
    same = [e for e in fast["log"] if e[0] < upto] == [e for e in base["log"] if e[0] < upto]
    print(f"same placements as the reference over the first fill and {upto} steady decisions: "
          f"{'yes' if same else 'NO'}")
    return same


def print_goals(title: str, rate_what: str, rate: float, p99_ms: float) -> None:
    """The queue benchmarks' goals, read for the steady state: >= 5,000 ``rate_what`` per second and p99
    decision <= 2 ms."""
    print(f"goal ({title}, steady state):")
    print(f"  >= 5,000 {rate_what}: {rate:,.0f}/s, {verdict(rate >= 5000)}")
    print(f"  p99 decision <= 2 ms: {p99_ms:.3f} ms, {verdict(p99_ms <= 2.0)}")
