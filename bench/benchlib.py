"""What the benchmarks share: the test suite's helpers (:func:`tests_module`), and what the scheduler
benchmarks (bench_slots.py, bench_ledger.py, bench_submit_latency.py) measure alike: the percentile, the
decision-latency figures, the verdict word and the queue benchmarks' arguments.
Imported by name: a benchmark runs as ``python bench/<name>.py``, so this folder is on ``sys.path``."""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
from pathlib import Path
from types import ModuleType

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
