"""The GPU check's pure part (docs/gpu-check.md): the eight checks, their goals, the verdicts, the time plan,
the printed lines and the JSON report. No I/O, no torch: ``bench/gpu_check.py`` runs the checks and the
unit tests in tests/bench/ test this module directly.

A check ends in one status:

* ``pass`` / ``fail``: measured on a CUDA GPU, the figure against the goal;
* ``error``: the check could not measure (an exception, a run that did not do what the check needs);
* ``timeout``: it ran past its time;
* ``dry``: ``--device cpu``: the check's code path ran on this CPU with simulated cards. Not a GPU check:
  its figures are labelled ``cpu dry run`` and never judged against a GPU goal;
* ``not_run``: no GPU (or the 8-minute budget ran out before it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SCHEMA = "xpufleet-gpu-check/1"
TOTAL_BUDGET_S = 420.0  # bench/gpu_check.py's share of make gpu-check's 8 minutes (the pytest part reuses it)
STATUSES = ("pass", "fail", "error", "timeout", "dry", "not_run")
NO_GPU_TEXT = "no GPU: nothing checked"
DRY_LABEL = "cpu dry run, not a GPU figure"

TRAINING_GOAL = 0.97  # TrainingLoop / hand-written samples/s (the same goal as bench/bench_training.py)
ESTIMATE_RANGE = (1.0, 1.3)  # estimate / max_memory_reserved (the same goal as bench/bench_estimate.py)
WEIGHTS_TOLERANCE = 1e-4  # max |w_nccl - w_gloo| after a few steps: float sums in another order
SERVER_TOLERANCE = 1e-4  # max |p_cuda - p_cpu| of the served probabilities
# The two training loops' final losses: on an accelerator the node folds the batch losses on the device in
# float32 (no sync per batch), the hand-written loop adds `.item()` floats in float64: they agree to rounding.
LOSS_RTOL = 1e-5
RESULT_TOLERANCE = 1e-6  # the neighbour of an out-of-memory run: its final metrics as when it ran alone


@dataclass(frozen=True)
class Check:
    """One check: its name (``--only``), what it measures, its goal in words, and its time on the GPU."""

    name: str
    title: str
    goal: str
    timeout_s: float


CHECKS: tuple[Check, ...] = (
    Check("training", "TrainingLoop on cuda vs the same hand-written loop, samples/s",
          f"node / hand-written >= {TRAINING_GOAL}", 45),
    Check("estimate_peaks", "real CUDA peak (max_memory_allocated, max_memory_reserved) vs the static estimate, "
          "every example graph and bench_estimate's larger graphs",
          f"estimate / reserved peak in [{ESTIMATE_RANGE[0]}, {ESTIMATE_RANGE[1]}] for every graph", 110),
    Check("cap", "the allocator cap: two budgeted runs share one card",
          "the run over its budget fails with the documented out-of-memory text; the other finishes with its "
          "result unchanged", 50),
    Check("nvml", "NVML per-process memory of a running run vs its own reserved peak + the CUDA context",
          "0 <= NVML - reserved <= the context allowance (XPUFLEET_EXECUTION_CUDA_CONTEXT_MIB)", 45),
    Check("warm_start", "the warm start: no CUDA context in the sidecar, the agent or their forkservers; "
          "submit -> end of the first batch, warm vs cold",
          "NVML lists only the run on the card; warm / cold < 1", 75),
    Check("ddp_nccl", "ddp with NCCL (world size 1, or 2 with two cards) vs the same training with gloo",
          f"max |weight difference| <= {WEIGHTS_TOLERANCE:g}", 60),
    Check("model_server", "the built-in model server on cuda vs the same model on the CPU",
          f"max |probability difference| <= {SERVER_TOLERANCE:g}", 50),
    Check("default_budget", "after one measured run, the default budget of the same graph",
          "budget = measured peak + 20% (to 0.01 GiB), and a run under it succeeds", 45),
)
CHECK_NAMES = tuple(c.name for c in CHECKS)


def check_named(name: str) -> Check:
    """The check called ``name``; ValueError naming the known ones otherwise."""
    for c in CHECKS:
        if c.name == name:
            return c
    raise ValueError(f"unknown check {name!r}: choose from {', '.join(CHECK_NAMES)}")


@dataclass
class Outcome:
    """What one check found: its status, its figure (numbers, JSON), the figure in words, and why."""

    name: str
    status: str
    figure: dict[str, Any] = field(default_factory=dict)
    figure_text: str = ""
    detail: str = ""
    elapsed_s: float = 0.0
    device: str = "cuda"

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def to_json(self) -> dict[str, Any]:
        check = check_named(self.name)
        return {**asdict(self), "title": check.title, "goal": check.goal, "gpu_figure": self.status in ("pass", "fail")}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Outcome:
        return Outcome(str(data["name"]), str(data["status"]), dict(data.get("figure") or {}),
                       str(data.get("figure_text") or ""), str(data.get("detail") or ""),
                       float(data.get("elapsed_s") or 0.0), str(data.get("device") or "cuda"))


# --- verdicts: a figure against its goal ---------------------------------------------------------------


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def at_least(value: Any, goal: float) -> bool:
    """``value >= goal`` (a missing or non-finite figure never meets a goal)."""
    return finite(value) and value >= goal


def within(value: Any, lo: float, hi: float) -> bool:
    """``lo <= value <= hi`` (a missing or non-finite figure is outside)."""
    return finite(value) and lo <= value <= hi


def max_abs_diff(a: Mapping[str, Sequence[float]], b: Mapping[str, Sequence[float]]) -> float:
    """The largest |a - b| over flat number lists keyed alike (weights by name, metrics); inf when the keys
    or lengths differ (a different model is never "within tolerance")."""
    if set(a) != set(b):
        return math.inf
    worst = 0.0
    for key in a:
        xs, ys = list(a[key]), list(b[key])
        if len(xs) != len(ys):
            return math.inf
        for x, y in zip(xs, ys, strict=True):
            if not (finite(x) and finite(y)):
                return math.inf
            worst = max(worst, abs(float(x) - float(y)))
    return worst


def ratio(num: Any, den: Any) -> float:
    """``num / den``; NaN when either is missing or the denominator is not positive."""
    if not (finite(num) and finite(den)) or den <= 0:
        return math.nan
    return float(num) / float(den)


def verdict(device: str, ok: bool) -> str:
    """``dry`` off the GPU (never judged), else ``pass`` / ``fail``."""
    if device != "cuda":
        return "dry"
    return "pass" if ok else "fail"


TIMING_SUFFIXES = ("_per_s", "_seconds", "_s")  # how fast, not what was computed: never part of a result


def metrics_numbers(metrics: Mapping[str, Any] | None) -> dict[str, list[float]]:
    """A run's ``final_metrics`` as flat number lists (what :func:`max_abs_diff` compares): scalars become
    one-element lists; lists of numbers or of ``[step, value]`` pairs are flattened; other values dropped,
    and so are timings (``samples_per_s``: they differ from run to run)."""
    out: dict[str, list[float]] = {}
    for key, value in (metrics or {}).items():
        if key.endswith(TIMING_SUFFIXES):
            continue
        if finite(value):
            out[key] = [float(value)]
        elif isinstance(value, list):
            flat: list[float] = []
            for v in value:
                flat += [float(x) for x in (v if isinstance(v, list) else [v]) if finite(x)]
            out[key] = flat
    return out


# --- the time plan -----------------------------------------------------------------------------------


def time_for(check: Check, left_s: float, scale: float = 1.0) -> float | None:
    """The seconds ``check`` gets when ``left_s`` remain of the total: its own limit (times ``scale``, e.g.
    slower CPU dry runs), cut to what is left; None when less than a third of its limit is left (it would
    only time out: it is reported ``not_run`` and the next ones still run)."""
    want = check.timeout_s * scale
    if left_s < want / 3:
        return None
    return min(want, left_s)


# --- what is printed and written -----------------------------------------------------------------------

TAGS = {"pass": "PASS", "fail": "FAIL", "error": "ERROR", "timeout": "TIMEOUT", "dry": "DRY", "not_run": "NOT RUN"}


def format_line(o: Outcome) -> str:
    """One line per check: ``[PASS] training: 0.985 (goal: node / hand-written >= 0.97) 12.3 s``; a dry line
    says it is no GPU figure."""
    check = check_named(o.name)
    tag = f"[{TAGS[o.status]}]"
    text = o.figure_text or "no figure"
    if o.status == "dry":
        text = f"{DRY_LABEL}: {text}"
    why = f"; {o.detail}" if o.detail and o.status != "pass" else ""
    return f"{tag:9} {o.name}: {text} (goal: {check.goal}){why} [{o.elapsed_s:.1f} s]"


def listing(checks: Iterable[Check] = CHECKS) -> list[str]:
    """What ``make gpu-check`` would run, one line per check (the no-GPU answer)."""
    return [f"  {i}. {c.name}: {c.title}; goal: {c.goal} (at most {c.timeout_s:g} s)"
            for i, c in enumerate(checks, 1)]


def summary(outcomes: Sequence[Outcome]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for o in outcomes:
        counts[o.status] += 1
    return counts


def passed(outcomes: Sequence[Outcome]) -> bool:
    """Whether the run is a success: every check passed (GPU) or ran dry (CPU); nothing checked for want of
    a GPU is no failure, a check left out for want of time is."""
    return all(o.status in ("pass", "dry") or (o.status == "not_run" and o.detail == NO_GPU_TEXT)
               for o in outcomes)


def build_report(outcomes: Sequence[Outcome], *, mode: str, gpu: Mapping[str, Any], elapsed_s: float,
                 load_avg: Sequence[float], started_at: str) -> dict[str, Any]:
    """The JSON report (``--json FILE``): the machine, the mode (``gpu``, ``dry-cpu``, ``no-gpu``), each check."""
    if mode not in ("gpu", "dry-cpu", "no-gpu"):
        raise ValueError(f"mode must be gpu, dry-cpu or no-gpu, got {mode!r}")
    return {"schema": SCHEMA, "mode": mode, "gpu": dict(gpu), "started_at": started_at,
            "elapsed_s": round(elapsed_s, 2), "load_avg": [round(x, 2) for x in load_avg],
            "nothing_checked": mode != "gpu", "checks": [o.to_json() for o in outcomes],
            "summary": summary(outcomes), "ok": passed(outcomes)}


def outcome_of(report: Mapping[str, Any], name: str) -> Outcome | None:
    """The outcome of check ``name`` in a report written by ``--json`` (None when it is not there)."""
    for entry in report.get("checks") or []:
        if entry.get("name") == name:
            return Outcome.from_json(entry)
    return None
