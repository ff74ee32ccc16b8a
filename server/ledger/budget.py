"""Which memory budget a run gets, and when it changes (docs/memory.md; docs/workers.md, "sharing a card"), pure.

* A budget the user typed (``target.memory_gib``, no ``memory_source`` or ``"user"``) is never changed.
* The default budget is the measured peak of a successful run of the same runtime-graph key on the same
  number of cards + 20% (the largest such peak, with the run it came from). It is what a run without a
  budget gets, and what an unmodified measured suggestion means: the Queue on... dialog does not send it
  (``memory_source: "measured"`` sent anyway gets the server's own default, which names its run).
* An unmodified static estimate is sent as the declared budget, marked ``memory_source: "estimate"``. When
  the graph has a larger measured default at submit time, or gets one while the run waits (another run of
  the same graph succeeds with a larger peak), the budget is raised to it and the reason kept; when the
  raised budget is larger than every card the run may use, the run fails with that reason instead of
  waiting forever.
* No measured peak and no budget, for a run that can only go to shared cards: rejected, asking for one.
  A run queued without a budget while its card was exclusive gets the default when the card turns shared
  (or later, once the graph has one); until then it waits (see :mod:`.fit`'s ``NO_BUDGET`` text).

Only CUDA allocator peaks are peaks: MPS reports the memory its driver holds at the end of a run (not a
peak), and a simulated card measures nothing on a card, so neither becomes a default budget of a real card.
A run whose cards are all simulated takes its default from simulated peaks only (``SIMULATED_SOURCES``: the
most tensor storage a run on simulated cards held on the CPU), labelled "simulated peak" wherever it shows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...constants import MEASURED_PEAK_HEADROOM
from .fit import gib_text

USER, MEASURED, ESTIMATE = "user", "measured", "estimate"
SOURCES = (USER, MEASURED, ESTIMATE)
PEAK_SOURCES = frozenset({"cuda"})  # what measures a peak a default budget may come from
SIMULATED_SOURCES = frozenset({"simulated"})  # ... for a run that can only go to simulated cards


class BudgetError(ValueError):
    """A run the server rejects (400) for its budget; the message says what to set."""


def cards_text(n: int) -> str:
    return f"{n} card" if n == 1 else f"{n} cards"


def with_headroom(peak_gib: float) -> float:
    """The default budget for a measured peak: + 20%, rounded up to 0.01 GiB."""
    return math.ceil(round(peak_gib * MEASURED_PEAK_HEADROOM * 100, 6)) / 100


@dataclass(frozen=True)
class MeasuredPeak:
    """The largest per-card peak of one finished run (GiB), and what measured it."""

    graph_key: str
    n_cards: int
    peak_gib: float
    run_id: str
    source: str = "cuda"  # "cuda": the allocator's high-water mark; "mps" (held at the end), "simulated"
    succeeded: bool = True


@dataclass(frozen=True)
class DefaultBudget:
    """Measured peak + 20% for a graph key on a number of cards, and the run it came from."""

    budget_gib: float
    peak_gib: float
    run_id: str
    n_cards: int
    source: str = "cuda"  # what measured the peak ("simulated": a simulated card's tensor bytes)


def _peak_words(source: str | None) -> str:
    return "simulated peak" if source == "simulated" else "peak"


def default_budget(peaks: Iterable[MeasuredPeak], graph_key: str, n_cards: int,
                   sources: frozenset[str] = PEAK_SOURCES) -> DefaultBudget | None:
    """The default budget of ``graph_key`` on ``n_cards`` cards: the largest peak among its successful runs
    measured by one of ``sources``, + 20%; None when there is none."""
    best: MeasuredPeak | None = None
    for p in peaks:
        if p.graph_key == graph_key and p.n_cards == n_cards and p.succeeded and p.source in sources \
                and p.peak_gib > 0 and (best is None or p.peak_gib > best.peak_gib):
            best = p
    if best is None:
        return None
    return DefaultBudget(with_headroom(best.peak_gib), best.peak_gib, best.run_id, n_cards, best.source)


@dataclass(frozen=True)
class Budget:
    """A run's budget per card. ``declared_gib``: what the run was sent with before a raise."""

    gib: float
    source: str
    from_run: str | None = None  # measured: the run whose peak it is
    peak_gib: float | None = None
    declared_gib: float | None = None
    reason: str | None = None  # why it is not what was declared
    peak_source: str | None = None  # measured from a simulated card ("simulated"); None: a CUDA peak

    def label(self) -> str:
        """The Runs panel's budget column: ``6.0 GiB``, ``7.4 GiB (peak of run a1b2c3d4 + 20%)``,
        ``3.2 GiB (est.)``."""
        if self.source == ESTIMATE:
            return f"{gib_text(self.gib)} GiB (est.)"
        if self.source == MEASURED and self.from_run:
            return f"{gib_text(self.gib)} GiB ({_peak_words(self.peak_source)} of run {self.from_run[:8]} + 20%)"
        return f"{gib_text(self.gib)} GiB"

    def to_json(self) -> dict[str, Any]:
        return {"budget_gib": self.gib, "budget_source": self.source, "budget_from_run": self.from_run,
                "budget_peak_gib": self.peak_gib, "budget_declared_gib": self.declared_gib,
                "budget_reason": self.reason, "budget_label": self.label(), "budget_peak_source": self.peak_source}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Budget:
        """The inverse of :meth:`to_json` (stored budgets)."""
        return Budget(float(data["budget_gib"]), str(data["budget_source"]), data.get("budget_from_run"),
                      data.get("budget_peak_gib"), data.get("budget_declared_gib"), data.get("budget_reason"),
                      data.get("budget_peak_source"))


def _measured(default: DefaultBudget, declared: float | None = None, reason: str | None = None) -> Budget:
    source = default.source if default.source != "cuda" else None
    return Budget(default.budget_gib, MEASURED, default.run_id, default.peak_gib, declared, reason, source)


def _peaked(default: DefaultBudget) -> str:
    if default.source == "simulated":
        return f"had a simulated peak of {gib_text(default.peak_gib)} GiB (+20%)"
    return f"peaked at {gib_text(default.peak_gib)} GiB (+20%)"


def _raise_reason(declared: float, default: DefaultBudget, later: bool) -> str:
    when = "while the run waited, run" if later else "run"
    return (f"raised from the estimate {gib_text(declared)} GiB to {gib_text(default.budget_gib)} GiB: {when} "
            f"{default.run_id[:8]} of the same graph on {cards_text(default.n_cards)} {_peaked(default)}")


def resolve_budget(memory_gib: float | None, memory_source: str | None, default: DefaultBudget | None, *,
                   n_cards: int, shared_only: bool,
                   estimate_gib: Callable[[], float | None] | None = None) -> Budget | None:
    """The budget a submitted run gets (None: no budget).

    ``memory_gib`` / ``memory_source``: the run's ``target`` (validated by ``parse_target``); ``default``:
    the graph's default budget on ``n_cards`` cards; ``shared_only``: every card the run may go to is
    shared by memory, so it cannot run without a budget (raises BudgetError asking for one).
    ``estimate_gib``: a ComfyUI workflow's static estimate (seed 001's M_peak from its model files'
    sizes; injected, None: no figure), used on shared cards when the workflow has no measured default."""
    if memory_source not in (None, *SOURCES):
        raise BudgetError(f"options.target.memory_source must be one of {', '.join(SOURCES)}")
    if memory_gib is None:
        if memory_source is not None:
            raise BudgetError("options.target.memory_source needs options.target.memory_gib")
        if default is not None:
            return _measured(default)
        estimated = estimate_gib() if shared_only and estimate_gib is not None else None
        if estimated is not None and estimated > 0:
            return Budget(float(estimated), ESTIMATE)
        if shared_only:
            raise BudgetError(
                f"this graph has no measured peak on {cards_text(n_cards)} and the run declares no budget: set "
                f"options.target.memory_gib (GiB per card) to queue it on a card shared by memory")
        return None
    if memory_source in (None, USER):
        return Budget(float(memory_gib), USER)
    if memory_source == MEASURED:
        if default is None:
            raise BudgetError(
                f"options.target.memory_source is \"measured\" but this graph has no measured peak on "
                f"{cards_text(n_cards)}: send memory_gib without memory_source to declare the budget yourself")
        return _measured(default)
    # an estimate: raised to a larger measured default
    if default is not None and default.budget_gib > memory_gib:
        return _measured(default, float(memory_gib), _raise_reason(float(memory_gib), default, later=False))
    return Budget(float(memory_gib), ESTIMATE)


@dataclass(frozen=True)
class Raise:
    """A waiting run's new budget; ``fail``: the run fails with this reason (no usable card is that big)."""

    budget: Budget
    fail: str | None = None


def raise_waiting(budget: Budget | None, default: DefaultBudget, fits_somewhere: Callable[[float], bool]) -> Raise | None:
    """A larger measured default arrived while the run waits (another run of the same graph on the same
    number of cards succeeded). Returns the raised budget, or None when nothing changes: a typed budget
    never changes, and a budget is only ever raised. ``fits_somewhere(gib)``: whether some card the run may
    use could ever hold that budget (the ledger's ``fits_ever`` over its candidates)."""
    if budget is None or budget.source == USER or default.budget_gib <= budget.gib:
        return None
    declared = budget.declared_gib if budget.declared_gib is not None else budget.gib
    if budget.source == ESTIMATE or budget.declared_gib is not None:
        reason = _raise_reason(declared, default, later=True)
    else:
        reason = (f"raised from {gib_text(budget.gib)} GiB to {gib_text(default.budget_gib)} GiB: while the run "
                  f"waited, run {default.run_id[:8]} of the same graph on {cards_text(default.n_cards)} "
                  f"{_peaked(default)}")
    raised = _measured(default, declared, reason)
    if not fits_somewhere(raised.gib):
        return Raise(raised, f"{reason}, more than any card this run may use has")
    return Raise(raised)


def fill_default(budget: Budget | None, default: DefaultBudget | None) -> Budget | None:
    """A run queued without a budget while its card was exclusive, now that the card is shared: the
    graph's default budget when there is one (None: it keeps waiting for one)."""
    if budget is not None:
        return budget
    return _measured(default) if default is not None else None


_SOURCE_WORDS = {USER: "the budget you typed", MEASURED: "the measured peak", ESTIMATE: "the static estimate"}


def oom_message(budget: Budget, device: str) -> str:
    """The error of a run that ran out of memory under its budget: where the budget came from and what to
    declare instead."""
    if budget.source == MEASURED and budget.from_run:
        what = "simulated" if budget.peak_source == "simulated" else "measured"
        came = f"the {what} peak of run {budget.from_run[:8]} + 20%"
    else:
        came = _SOURCE_WORDS.get(budget.source, budget.source)
    return (f"out of memory on {device} under its budget of {gib_text(budget.gib)} GiB ({came}): declare a larger "
            f"options.target.memory_gib")


# --- the suggestion the Queue on... dialog shows (POST /api/estimates) ----------------------------------


@dataclass(frozen=True)
class Suggestion:
    """What the budget field shows: the measured default, or the static estimate, item by item.

    ``budget_gib`` is the value to prefill (None: the field stays empty, as for a rough estimate or when
    no estimate could be made); ``items`` add up to ``total_gib``."""

    source: str  # "measured" | "estimate" | "none"
    budget_gib: float | None
    total_gib: float | None
    items: tuple[Mapping[str, Any], ...] = ()
    rough: bool = False
    reasons: tuple[str, ...] = ()
    from_run: str | None = None
    n_cards: int = 1
    extra: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"source": self.source, "budget_gib": self.budget_gib, "total_gib": self.total_gib,
                "items": [dict(i) for i in self.items], "rough": self.rough, "reasons": list(self.reasons),
                "from_run": self.from_run, "n_cards": self.n_cards, **self.extra}


def suggest(graph: Mapping[str, Any], default: DefaultBudget | None, *,
            estimate: Callable[[Mapping[str, Any]], Any], n_cards: int = 1) -> Suggestion:
    """The suggestion for ``graph`` on ``n_cards`` cards. The estimate is never built when a measured
    default exists. ``estimate``: the static estimator, injected so the ledger stays pure (the callers
    pass :func:`xpufleet.predictor.estimate.estimate_graph`)."""
    if default is not None:
        headroom = default.budget_gib - default.peak_gib
        items = ({"name": "measured_peak", "gib": default.peak_gib,
                  "label": f"{_peak_words(default.source)} of run {default.run_id[:8]} on {cards_text(n_cards)}"},
                 {"name": "headroom", "gib": round(headroom, 4), "label": "+20%"})
        return Suggestion(MEASURED, default.budget_gib, default.budget_gib, items, from_run=default.run_id,
                          n_cards=n_cards, extra={"peak_source": default.source})
    est = estimate(graph)
    total = est.total_gib
    if total is None:
        return Suggestion("none", None, None, tuple(i.to_json() for i in est.items), est.rough, tuple(est.reasons),
                          n_cards=n_cards)
    return Suggestion(ESTIMATE, None if est.rough else total, total, tuple(i.to_json() for i in est.items),
                      est.rough, tuple(est.reasons), n_cards=n_cards, extra={"elapsed_s": est.elapsed_s})
