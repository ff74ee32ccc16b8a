"""The per-card memory ledger and the fit rule (docs/memory.md; docs/workers.md, "sharing a card"), pure: no I/O, no clock.

For every card shared by memory the server keeps one ledger entry:

* ``total`` and ``free`` from the worker's last heartbeat (``free`` counts every process on the card, other
  users' work included);
* **reserved**: the budgets of runs assigned to the card that have not started;
* **running**: the budgets of runs that have started (runs taken over after a sidecar restart included).

A run on a CUDA card also holds its own CUDA context (cuBLAS handles, loaded kernels) that the allocator cap
does not cover, so every run counts as its budget + ``XPUFLEET_EXECUTION_CUDA_CONTEXT_MIB`` (768 MiB by
default). A run fits when::

    budget + context <= min(free - reserved, total - reserved - running)

``free - reserved``: what is free now, less what assigned runs are about to take. ``total - reserved -
running``: what the budgets leave, so a running run that has not reached its peak yet keeps its share.

A run without a budget on a shared card (a canvas run on a same-machine worker's card, or a run that
started before the card was made shared) holds the card alone until it ends. A shared MPS card reports no
total, so it cannot admit runs by budget; a CUDA card that has not reported its memory yet keeps runs
waiting until the worker's next heartbeat.

Figures are kept in bytes (integers), so sums that go up and down stay exact and the rule's boundary is
exact. The texts are the seed's: ``needs 12.0 GiB, cuda:1 on gpu-box has 6.3 GiB free (runs a1b2c3d4,
c3d4e5f6)``, and with a CUDA context ``needs 6.0 GiB (+0.8 GiB CUDA context), ...``.

A scheduler asks :meth:`Ledger.card_status` / :meth:`Ledger.candidate_status` (does a budget fit on a card
or a device set now, or ever), :meth:`Ledger.decide` (admit, wait or reject a run with the text to show),
and :meth:`Ledger.admitter` (the ``admit`` callback of :func:`xpufleet.server.scheduling.plan.plan`); the
incremental queue of runs waiting for memory is in :mod:`.queue`.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...constants import CUDA_CONTEXT_MIB, ENV_CUDA_CONTEXT_MIB

GIB = 1024**3
MIB = 1024**2
RUNS_SHOWN = 6  # run ids a rejection text lists for one card; the rest are counted
MAX_REASONS = 3  # candidate texts a decision spells out; the rest are counted


def context_mib_from_env(environ: Mapping[str, str] | None = None) -> int:
    """``XPUFLEET_EXECUTION_CUDA_CONTEXT_MIB`` (default 768); raises ValueError naming the variable."""
    raw = (os.environ if environ is None else environ).get(ENV_CUDA_CONTEXT_MIB, "").strip()
    if not raw:
        return CUDA_CONTEXT_MIB
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{ENV_CUDA_CONTEXT_MIB}={raw!r} is not a whole number of MiB (default {CUDA_CONTEXT_MIB})") \
            from None
    if value < 0:
        raise ValueError(f"{ENV_CUDA_CONTEXT_MIB} must be >= 0 MiB, got {value}")
    return value


def to_bytes(gib: float) -> int:
    """GiB (a budget, a heartbeat figure) as whole bytes."""
    return int(round(float(gib) * GIB))


def short_id(run_id: str) -> str:
    return run_id[:8]


def fits(need: int, room: int) -> bool:
    """The fit rule itself: ``need`` = budget + context; ``room`` = min(free - reserved, total - reserved -
    running)."""
    return need <= room


# --- card states ---------------------------------------------------------------------------------------

FITS = "fits"  # fits now
NOT_NOW = "not_now"  # fits an emptier card: wait for memory
HELD = "held"  # a run without a budget holds the card alone until it ends
NEVER = "never"  # larger than the card's total
UNREPORTED = "unreported"  # a CUDA card that has not reported its memory yet: decided at the next heartbeat
NO_TOTAL = "no_total"  # shared MPS: no total reported, so no admission by budget
NO_BUDGET = "no_budget"  # the run has no budget and the card is shared: it waits for a measured peak
UNKNOWN_CARD = "unknown_card"  # not in the ledger (its worker has not reported it)
NOT_SHARED = "not_shared"  # an exclusive card: memory does not decide (the slot rule does)

_ADMITS = frozenset({FITS, NOT_SHARED})
_NEVER = frozenset({NEVER, NO_TOTAL})


@dataclass
class Card:
    """One card's ledger entry (bytes). ``reserved`` / ``running``: run id -> budget (None: no budget)."""

    key: str
    label: str  # "cuda:1 on gpu-box"
    kind: str  # "cuda" | "mps" | ...
    shared: bool = True
    total: int | None = None
    free: int | None = None
    reserved: dict[str, int | None] = field(default_factory=dict)
    running: dict[str, int | None] = field(default_factory=dict)
    reserved_sum: int = 0  # budget + context of every budgeted reserved run
    running_sum: int = 0
    unbudgeted: int = 0  # runs on the card without a budget (each holds it alone)

    def runs(self) -> list[str]:
        return [*self.running, *self.reserved]

    def room(self) -> int | None:
        """min(free - reserved, total - reserved - running); None until both figures are reported."""
        if self.total is None or self.free is None:
            return None
        return min(self.free - self.reserved_sum, self.total - self.reserved_sum - self.running_sum)


@dataclass(frozen=True)
class Decision:
    """What to do with a run: ``admit`` on ``candidate`` (an index into the run's candidates), ``wait``, or
    ``reject``. ``reason`` is the seed's text; ``hint`` (optional) says how to change the request."""

    action: str
    candidate: int | None = None
    reason: str | None = None
    hint: str | None = None

    @property
    def message(self) -> str | None:
        if self.reason is None:
            return None
        return f"{self.reason} ({self.hint})" if self.hint else self.reason


@dataclass
class _Holding:
    keys: tuple[str, ...]
    budget: int | None
    started: bool


def gib_text(gib: float) -> str:
    """A budget in the texts: one decimal as the seed writes them (``12.0``), two below 1 GiB (``0.05``),
    so a small budget is never shown as another number."""
    return f"{gib:.1f}" if gib >= 1 or gib == 0 else f"{gib:.2f}"


def _gib(value: int) -> str:
    return f"{value / GIB:.1f}"


def _free_gib(room: int) -> str:
    """A free figure rounded down to 0.1 GiB (0.01 below 1 GiB; never shown larger than it is), at least 0."""
    step = 10 if room >= GIB or room <= 0 else 100
    value = math.floor(max(0, room) * step / GIB + 1e-6) / step  # 1e-6: GiB figures are rounded to bytes
    return f"{value:.1f}" if step == 10 else f"{value:.2f}"


class Ledger:
    """Every card's ledger entry and the runs counted on them (see the module docstring).

    Keys are the slot keys of :mod:`xpufleet.server.scheduling` (a card's UUID, else provider/device), so one
    physical card offered by several providers has one entry. ``grown`` collects the cards whose room may
    have grown since :meth:`pop_grown` was last called (the incremental queue re-decides only those)."""

    def __init__(self, context_mib: int = CUDA_CONTEXT_MIB) -> None:
        if context_mib < 0:
            raise ValueError(f"the CUDA context must be >= 0 MiB, got {context_mib}")
        self.context = int(context_mib) * MIB
        self.cards: dict[str, Card] = {}
        self.runs: dict[str, _Holding] = {}
        self.grown: set[str] = set()

    # --- cards --------------------------------------------------------------------------------------

    def context_for(self, card: Card) -> int:
        """The CUDA context a run counts on ``card`` (bytes; 0 off CUDA)."""
        return self.context if card.kind == "cuda" else 0

    def set_card(self, key: str, label: str, kind: str, *, shared: bool = True, total_gib: float | None = None,
                 free_gib: float | None = None) -> Card:
        """Add a card or update its description (its runs stay counted)."""
        card = self.cards.get(key)
        if card is None:
            card = self.cards[key] = Card(key, label, kind, shared)
        else:
            card.label, card.kind, card.shared = label, kind, shared
        card.total = to_bytes(total_gib) if total_gib is not None else None
        card.free = to_bytes(free_gib) if free_gib is not None else None
        self.grown.add(key)
        return card

    def report(self, key: str, total_gib: float | None, free_gib: float | None) -> None:
        """A heartbeat's figures for a card."""
        card = self.cards[key]
        before = card.room()
        card.total = to_bytes(total_gib) if total_gib is not None else None
        card.free = to_bytes(free_gib) if free_gib is not None else None
        after = card.room()
        if after is not None and (before is None or after > before):
            self.grown.add(key)

    def set_shared(self, key: str, shared: bool) -> None:
        """The card's mode changed (exclusive <-> shared by memory)."""
        card = self.cards[key]
        if card.shared != shared:
            card.shared = shared
            self.grown.add(key)

    def drop_card(self, key: str) -> None:
        """Forget a card (its worker was removed); its runs stay recorded until released."""
        self.cards.pop(key, None)
        self.grown.discard(key)

    def pop_grown(self) -> set[str]:
        grown, self.grown = self.grown, set()
        return grown

    # --- runs ---------------------------------------------------------------------------------------

    def _count(self, run_id: str, keys: Sequence[str], budget: int | None, started: bool) -> None:
        if run_id in self.runs:
            raise ValueError(f"run {run_id} is counted on the ledger already")
        for key in keys:
            card = self.cards.get(key)
            if card is None:
                continue
            side = card.running if started else card.reserved
            side[run_id] = budget
            if budget is None:
                card.unbudgeted += 1
            elif started:
                card.running_sum += budget + self.context_for(card)
            else:
                card.reserved_sum += budget + self.context_for(card)
        self.runs[run_id] = _Holding(tuple(keys), budget, started)

    def reserve(self, run_id: str, keys: Sequence[str], budget_gib: float | None) -> None:
        """Count a run assigned to ``keys`` that has not started (reserved)."""
        self._count(run_id, keys, to_bytes(budget_gib) if budget_gib is not None else None, False)

    def hold_running(self, run_id: str, keys: Sequence[str], budget_gib: float | None) -> None:
        """Count a started run (one taken over after a sidecar restart starts here)."""
        self._count(run_id, keys, to_bytes(budget_gib) if budget_gib is not None else None, True)

    def start(self, run_id: str) -> None:
        """An assigned run started: its budget moves from reserved to running."""
        held = self.runs[run_id]
        if held.started:
            return
        held.started = True
        for key in held.keys:
            card = self.cards.get(key)
            if card is None or run_id not in card.reserved:
                continue
            budget = card.reserved.pop(run_id)
            card.running[run_id] = budget
            if budget is not None:
                counted = budget + self.context_for(card)
                card.reserved_sum -= counted
                card.running_sum += counted
            # free - reserved grows until the next heartbeat shows the run's use in ``free``
            self.grown.add(key)

    def release(self, run_id: str) -> None:
        """A run ended (or its assignment was undone): nothing of it is counted any more."""
        held = self.runs.pop(run_id, None)
        if held is None:
            return
        for key in held.keys:
            card = self.cards.get(key)
            if card is None:
                continue
            for side, is_running in ((card.reserved, False), (card.running, True)):
                if run_id in side:
                    budget = side.pop(run_id)
                    if budget is None:
                        card.unbudgeted -= 1
                    elif is_running:
                        card.running_sum -= budget + self.context_for(card)
                    else:
                        card.reserved_sum -= budget + self.context_for(card)
            self.grown.add(key)

    # --- questions ----------------------------------------------------------------------------------

    def room(self, key: str) -> int | None:
        """Bytes a new run (budget + context) may take on the card now; None until it reports memory."""
        card = self.cards.get(key)
        return card.room() if card is not None else None

    def card_status(self, key: str, budget: int | None) -> str:
        """Whether a budget of ``budget`` bytes fits on one card: one of the states above."""
        card = self.cards.get(key)
        if card is None:
            return UNKNOWN_CARD
        if not card.shared:
            return NOT_SHARED
        if card.total is None:
            return UNREPORTED if card.kind == "cuda" else NO_TOTAL
        if budget is None:
            return NO_BUDGET
        need = budget + self.context_for(card)
        if need > card.total:
            return NEVER
        if card.unbudgeted:
            return HELD
        room = card.room()
        if room is None:
            return UNREPORTED
        return FITS if fits(need, room) else NOT_NOW

    def candidate_status(self, keys: Sequence[str], budget: int | None) -> str:
        """A device set fits when every card fits; it never fits when one card never does."""
        states = [self.card_status(k, budget) for k in keys]
        if all(s in _ADMITS for s in states):
            return FITS
        for worst in (NEVER, NO_TOTAL, UNREPORTED, UNKNOWN_CARD, NO_BUDGET, HELD):
            if worst in states:
                return worst
        return NOT_NOW

    def fits_now(self, keys: Sequence[str], budget_gib: float | None) -> bool:
        return self.candidate_status(keys, to_bytes(budget_gib) if budget_gib is not None else None) == FITS

    def fits_ever(self, keys: Sequence[str], budget_gib: float | None) -> bool | None:
        """Whether the budget fits the device set once its cards are empty (None: not known yet)."""
        status = self.candidate_status(keys, to_bytes(budget_gib) if budget_gib is not None else None)
        if status in _NEVER:
            return False
        if status in (UNREPORTED, UNKNOWN_CARD):
            return None
        return True

    # --- texts --------------------------------------------------------------------------------------

    def needs_text(self, card: Card, budget: int) -> str:
        """``needs 6.0 GiB (+0.8 GiB CUDA context)`` (no context part off CUDA or with a zero context)."""
        context = self.context_for(card)
        return f"needs {gib_text(budget / GIB)} GiB" + (f" (+{_gib(context)} GiB CUDA context)" if context else "")

    def card_text(self, key: str, budget: int | None) -> str | None:
        """Why ``budget`` does not fit on one card now (None when it fits)."""
        status = self.card_status(key, budget)
        card = self.cards.get(key)
        if status in _ADMITS:
            return None
        if card is None:
            return f"card {key} has not been reported by its worker"
        if status == UNREPORTED:
            return (f"{card.label} has not reported its memory yet: the budget is decided after the worker's "
                    f"next heartbeat")
        if status == NO_TOTAL:
            return (f"{card.label} is shared by memory, but an MPS device does not report its total memory, so it "
                    f"cannot admit runs by budget; make it exclusive again to run there")
        if status == NO_BUDGET:
            return (f"{card.label} is shared by memory and this run has no budget: it waits until the same graph "
                    f"has a measured peak on the same number of cards (to start sooner, cancel it and queue it "
                    f"again with target.memory_gib)")
        assert budget is not None
        if status == NEVER:
            return f"{self.needs_text(card, budget)}, more than {card.label} has in all ({_gib(card.total or 0)} GiB)"
        if status == HELD:
            holders = [r for r, b in (*card.running.items(), *card.reserved.items()) if b is None]
            who = ", ".join(short_id(r) for r in holders)
            return (f"{self.needs_text(card, budget)}, {card.label} is held by run {who}, which has no budget "
                    f"and holds the card alone until it ends")
        runs = card.runs()
        listed = ", ".join(short_id(r) for r in runs[:RUNS_SHOWN])
        if len(runs) > RUNS_SHOWN:
            listed += f" and {len(runs) - RUNS_SHOWN} more"
        on_card = f" (runs {listed})" if runs else ""
        return f"{self.needs_text(card, budget)}, {card.label} has {_free_gib(card.room() or 0)} GiB free{on_card}"

    def candidate_text(self, keys: Sequence[str], budget: int | None) -> str | None:
        texts = [t for k in keys if (t := self.card_text(k, budget)) is not None]
        return "; ".join(dict.fromkeys(texts)) if texts else None

    def _texts(self, candidates: Sequence[Sequence[str]], budget: int | None) -> str:
        texts: list[str] = []
        extra = 0
        for keys in candidates:
            text = self.candidate_text(keys, budget)
            if text is None or text in texts:
                continue
            if len(texts) >= MAX_REASONS:
                extra += 1
            else:
                texts.append(text)
        shown = "; ".join(texts)
        return shown + (f"; and {extra} other candidate{'s' if extra != 1 else ''}" if extra else "")

    def card_view(self, key: str) -> dict[str, Any] | None:
        """One card as the Workers panel draws it (GiB): the heartbeat's total and free, what the runs'
        budgets reserve and hold (each + its CUDA context), what is free for a new budget once the CUDA
        context is taken off, and the runs on it (None: not a card of this ledger)."""
        card = self.cards.get(key)
        if card is None:
            return None
        context = self.context_for(card)
        room = card.room()
        runs = [{"id": r, "state": "running", "budget_gib": None if b is None else round(b / GIB, 3)}
                for r, b in card.running.items()]
        runs += [{"id": r, "state": "reserved", "budget_gib": None if b is None else round(b / GIB, 3)}
                 for r, b in card.reserved.items()]
        note = None
        if card.total is None:
            note = self.card_text(key, GIB)  # the MPS and "not reported yet" texts
        elif card.unbudgeted:
            holders = [r["id"] for r in runs if r["budget_gib"] is None]
            note = (f"held by run {', '.join(short_id(r) for r in holders)}, which has no budget and holds the "
                    f"card alone until it ends")
        return {
            "shared": card.shared,
            "total_gib": None if card.total is None else round(card.total / GIB, 3),
            "free_gib": None if card.free is None else round(card.free / GIB, 3),
            "in_use_gib": None if card.total is None or card.free is None else round((card.total - card.free) / GIB, 3),
            "reserved_gib": round(card.reserved_sum / GIB, 3),
            "running_gib": round(card.running_sum / GIB, 3),
            "context_gib": round(context / GIB, 3),
            "free_for_budgets_gib": None if room is None else float(_free_gib(room - context)),
            "runs": runs,
            "note": note,
        }

    # --- decisions ----------------------------------------------------------------------------------

    def decide(self, budget_gib: float | None, candidates: Sequence[Sequence[str]], *, named: bool,
               wait: bool | None = None) -> Decision:
        """Admit, wait or reject a run whose budget is ``budget_gib`` per card, with its candidates (each a
        tuple of card keys, in preference order).

        ``named``: the run names its worker (or this server): it is rejected at once when it does not fit
        unless ``wait`` is true. Otherwise (``any``, a pool) it waits unless the budget exceeds every
        candidate or ``wait`` is false. A budget larger than every candidate is rejected either way; a card
        that has not reported its memory yet, and a run without a budget that waits for a measured peak,
        keep the run waiting either way."""
        budget = to_bytes(budget_gib) if budget_gib is not None else None
        states = [self.candidate_status(keys, budget) for keys in candidates]
        for i, status in enumerate(states):
            if status == FITS:
                return Decision("admit", i)
        if not candidates:
            return Decision("reject", reason="the run has no card to go to")
        if all(s in _NEVER for s in states):
            text = self._texts(candidates, budget)
            if len(candidates) > 1:
                text = f"the budget is larger than every card the run may use: {text}"
            return Decision("reject", reason=text, hint="declare a smaller target.memory_gib or choose larger cards")
        pending = [c for c, s in zip(candidates, states, strict=True) if s in (UNREPORTED, UNKNOWN_CARD, NO_BUDGET)]
        waiting = wait if wait is not None else not named
        if pending and not waiting:
            return Decision("wait", reason=self._texts(pending, budget))
        if not waiting:
            return Decision("reject", reason=self._texts(candidates, budget),
                            hint="set target.wait to true to queue it until it fits")
        return Decision("wait", reason=f"waiting for memory: {self._texts(candidates, budget)}")

    def admitter(self, state: Any, budgets: Mapping[str, float | None]) -> Callable[[Any, Any], bool | str]:
        """The ``admit`` callback of one :func:`xpufleet.server.scheduling.plan.plan` pass: a candidate is admitted
        when its run's budget fits on every card of it, counting the runs this pass admitted before it
        (as reserved); otherwise the answer is the text why. ``state``: the pass's SlotState (for the
        candidates' slot keys); ``budgets``: run id -> budget in GiB (None: no budget)."""
        taken: dict[str, int] = {}  # slot key -> budget + context admitted in this pass
        index = state.index

        def admit(run: Any, cand: Any) -> bool | str:
            keys = [k for pair in cand.pairs if (k := index.get(pair)) is not None]  # a spread run: every part
            raw = budgets.get(run.run_id)
            budget = to_bytes(raw) if raw is not None else None
            texts = []
            for key in keys:
                status = self.card_status(key, budget)
                if status == FITS:
                    card = self.cards[key]
                    if not fits(budget + self.context_for(card), (card.room() or 0) - taken.get(key, 0)):  # type: ignore[operator]
                        texts.append(f"{self.needs_text(card, budget)}, {card.label} is taken by runs placed "  # type: ignore[arg-type]
                                     f"before this one")
                elif status != NOT_SHARED:
                    texts.append(self.card_text(key, budget) or status)
            if texts:
                return "; ".join(texts)
            for key in keys:
                card = self.cards.get(key)
                if card is not None and card.shared and budget is not None:
                    taken[key] = taken.get(key, 0) + budget + self.context_for(card)
            return True

        return admit
