"""Runs waiting for memory on shared cards, planned incrementally (SPEC M), pure.

The rule (:func:`plan_reference`): walk the waiting runs in submission order; each starts on the first of
its candidates (a card, or a device set) on which its budget fits by :mod:`.fit`'s rule, counting the runs
placed before it in the same pass (they are reserved on the ledger as they are placed). No memory is held
for a run that does not fit: a smaller run submitted later may start first on a card with room for it but
not for the earlier one (the seed asks that runs wait until memory frees, and leaves the order among them
open; holding memory for the earliest run would leave it idle while that run waits).

:class:`MemoryQueue` gives the same placements without looking at every waiting run. After a pass, no
waiting run fits anywhere; a later pass can only place runs that want a card whose room grew (the ledger
records those: a run ended or started, a heartbeat showed more free memory, a card was added or changed
mode), or runs submitted since. For each card the queue keeps the runs that want it in submission order
with their budgets in a min-tree, so "the earliest waiting run whose budget fits this card's room" is one
O(log n) search; the pass merges those searches over the grown cards in submission order, re-decides each
run found against all its candidates, and then looks at the new runs.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from .fit import FITS, Ledger, to_bytes

INF = float("inf")


@dataclass(frozen=True)
class MemoryRun:
    """A budgeted run waiting for memory: ``candidates`` are tuples of card keys, in preference order."""

    run_id: str
    budget_gib: float | None
    candidates: tuple[tuple[str, ...], ...]


@dataclass(frozen=True)
class MemoryPlacement:
    run_id: str
    candidate: int  # index into the run's candidates
    keys: tuple[str, ...]


def _first_fit(ledger: Ledger, run: MemoryRun, budget: int | None) -> int | None:
    for i, keys in enumerate(run.candidates):
        if ledger.candidate_status(keys, budget) == FITS:
            return i
    return None


def plan_reference(runs: Iterable[MemoryRun], ledger: Ledger) -> list[MemoryPlacement]:
    """The rule as a full pass over ``runs`` (submission order); placed runs are reserved on ``ledger``."""
    out: list[MemoryPlacement] = []
    for run in runs:
        budget = to_bytes(run.budget_gib) if run.budget_gib is not None else None
        i = _first_fit(ledger, run, budget)
        if i is not None:
            keys = run.candidates[i]
            ledger.reserve(run.run_id, keys, run.budget_gib)
            out.append(MemoryPlacement(run.run_id, i, keys))
    return out


class _MinTree:
    """Values in append order with the minimum of every power-of-two block: the first position at or
    after ``start`` whose value is at most ``limit`` is found in O(log n)."""

    __slots__ = ("size", "tree", "n")

    def __init__(self, values: Sequence[float] = ()) -> None:
        size = 1
        while size < max(1, len(values)):
            size *= 2
        self.size = size
        self.n = len(values)
        tree: list[float] = [INF] * (2 * size)
        tree[size:size + len(values)] = values
        for i in range(size - 1, 0, -1):
            a, b = tree[2 * i], tree[2 * i + 1]
            tree[i] = a if a < b else b
        self.tree = tree

    def append(self, value: float) -> int:
        if self.n == self.size:
            self.__init__(self.tree[self.size:self.size + self.n] + [value])  # type: ignore[misc]
            return self.n - 1
        pos = self.n
        self.n += 1
        self.set(pos, value)
        return pos

    def set(self, pos: int, value: float) -> None:
        tree = self.tree
        i = pos + self.size
        tree[i] = value
        i >>= 1
        while i:
            a, b = tree[2 * i], tree[2 * i + 1]
            m = a if a < b else b
            if tree[i] == m:
                break
            tree[i] = m
            i >>= 1

    def first_at_most(self, limit: float, start: int) -> int | None:
        if start >= self.n:
            return None
        tree, size = self.tree, self.size
        i = start + size
        while tree[i] > limit:
            while i & 1:  # a right child: climb to the first ancestor that is a left child
                i >>= 1
            if i == 0:
                return None
            i += 1  # its right sibling covers the next positions
        while i < size:
            i = 2 * i if tree[2 * i] <= limit else 2 * i + 1
        pos = i - size
        return pos if pos < self.n else None


class _CardRuns:
    """The waiting runs that want one card, in submission order, with their budgets (INF: gone or none)."""

    __slots__ = ("seqs", "tree", "pos_of", "dead")

    def __init__(self) -> None:
        self.seqs: list[int] = []
        self.tree = _MinTree()
        self.pos_of: dict[int, int] = {}
        self.dead = 0

    def add(self, seq: int, budget: float) -> None:
        self.pos_of[seq] = self.tree.append(budget)
        self.seqs.append(seq)

    def set(self, seq: int, budget: float) -> None:
        self.tree.set(self.pos_of[seq], budget)

    def drop(self, seq: int) -> None:
        pos = self.pos_of.pop(seq, None)
        if pos is not None:
            self.tree.set(pos, INF)
            self.dead += 1

    def compact(self, budgets: dict[int, float]) -> None:
        if self.dead < 64 or self.dead * 2 < len(self.seqs):
            return
        self.seqs = [s for s in self.seqs if s in self.pos_of]
        self.pos_of = {s: i for i, s in enumerate(self.seqs)}
        self.tree = _MinTree([budgets[s] for s in self.seqs])
        self.dead = 0


class MemoryQueue:
    """The waiting runs of one :class:`Ledger`, planned incrementally (see the module docstring).

    :meth:`plan` reserves the runs it places on the ledger and takes them out of the queue; the caller
    starts them (``ledger.start``), or releases them and adds them again when an assignment fails.
    Exclusive cards (not shared) do not limit by memory here: give this queue runs whose candidates are
    cards shared by memory, and the slot rule the rest."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._seq = 0
        self._runs: dict[int, MemoryRun] = {}
        self._budget: dict[int, float] = {}  # seq -> budget bytes (INF: no budget)
        self._by_id: dict[str, int] = {}
        self._cards: dict[str, _CardRuns] = {}
        self._new: list[int] = []
        self._recheck: list[int] = []
        self._upto = 0  # runs with seq <= upto were decided by the last pass
        self._fresh = True  # no pass yet: the first looks at every run
        self._planning = False  # positions in a pass's heap must stay put: compact after it
        self._to_compact: set[str] = set()

    def __len__(self) -> int:
        return len(self._runs)

    def __contains__(self, run_id: str) -> bool:
        return run_id in self._by_id

    def runs(self) -> list[MemoryRun]:
        """The waiting runs in submission order."""
        return [self._runs[s] for s in sorted(self._runs)]

    def add(self, run: MemoryRun) -> None:
        if run.run_id in self._by_id:
            raise ValueError(f"run {run.run_id} is queued already")
        self._seq += 1
        seq = self._seq
        budget = to_bytes(run.budget_gib) if run.budget_gib is not None else INF
        self._runs[seq] = run
        self._budget[seq] = budget
        self._by_id[run.run_id] = seq
        for key in dict.fromkeys(k for keys in run.candidates for k in keys):
            cards = self._cards.get(key)
            if cards is None:
                cards = self._cards[key] = _CardRuns()
            cards.add(seq, budget)
        self._new.append(seq)

    def remove(self, run_id: str) -> MemoryRun | None:
        seq = self._by_id.pop(run_id, None)
        if seq is None:
            return None
        run = self._runs.pop(seq)
        budgets = self._budget
        for key in dict.fromkeys(k for keys in run.candidates for k in keys):
            cards = self._cards[key]
            cards.drop(seq)
            if self._planning:
                self._to_compact.add(key)
            else:
                cards.compact(budgets)
        del budgets[seq]
        return run

    def set_budget(self, run_id: str, budget_gib: float | None) -> None:
        """A waiting run's budget changed (raised to a measured peak, or given one): it keeps its place."""
        seq = self._by_id[run_id]
        run = self._runs[seq]
        self._runs[seq] = MemoryRun(run.run_id, budget_gib, run.candidates)
        budget = to_bytes(budget_gib) if budget_gib is not None else INF
        self._budget[seq] = budget
        for key in dict.fromkeys(k for keys in run.candidates for k in keys):
            self._cards[key].set(seq, budget)
        if seq <= self._upto:
            self._recheck.append(seq)

    # --- planning -------------------------------------------------------------------------------

    def _limit(self, key: str) -> float | None:
        """The largest budget that fits the card's room now (None: nothing fits there)."""
        card = self.ledger.cards.get(key)
        if card is None:
            return None
        if not card.shared:
            return INF
        room = card.room()
        if room is None or card.unbudgeted:
            return None
        return room - self.ledger.context_for(card)

    def _next(self, heap: list[tuple[int, str, int]], key: str, start: int) -> None:
        cards = self._cards.get(key)
        if cards is None:
            return
        limit = self._limit(key)
        if limit is None:
            return
        pos = cards.tree.first_at_most(limit, start)
        if pos is not None and cards.seqs[pos] <= self._upto:
            heapq.heappush(heap, (cards.seqs[pos], key, pos))

    def _place(self, seq: int, out: list[MemoryPlacement]) -> bool:
        run = self._runs.get(seq)
        if run is None:
            return False
        budget = self._budget[seq]
        i = _first_fit(self.ledger, run, None if budget == INF else int(budget))
        if i is None:
            return False
        keys = run.candidates[i]
        self.ledger.reserve(run.run_id, keys, run.budget_gib)
        out.append(MemoryPlacement(run.run_id, i, keys))
        self.remove(run.run_id)
        return True

    def plan(self) -> list[MemoryPlacement]:
        """Place what fits now (the placements of :func:`plan_reference` over :meth:`runs`)."""
        grown = self.ledger.pop_grown()
        out: list[MemoryPlacement] = []
        self._planning = True
        try:
            self._pass(grown, out)
        finally:
            self._planning = False
        for key in self._to_compact:
            self._cards[key].compact(self._budget)
        self._to_compact = set()
        self._new = []
        self._recheck = []
        self._upto = self._seq
        return out

    def _pass(self, grown: set[str], out: list[MemoryPlacement]) -> None:
        if self._fresh:
            self._fresh = False
            for seq in sorted(self._runs):
                self._place(seq, out)
        else:
            heap: list[tuple[int, str, int]] = [(seq, "", -1) for seq in self._recheck]
            heapq.heapify(heap)
            for key in grown:
                self._next(heap, key, 0)
            last = 0
            while heap:
                seq, key, pos = heapq.heappop(heap)
                if seq != last:
                    last = seq
                    self._place(seq, out)
                if key:
                    self._next(heap, key, pos + 1)
            for seq in self._new:
                if seq in self._runs:
                    self._place(seq, out)
