"""Runs waiting for memory on shared cards, planned incrementally (docs/memory.md), pure.

The rule (:func:`plan_reference`): walk the waiting runs in submission order; each starts on the first of
its candidates (a card, or a device set) on which its budget fits by :mod:`.fit`'s rule, counting the runs
placed before it in the same pass (they are reserved on the ledger as they are placed). No memory is held
for a run that does not fit: a smaller run submitted later may start first on a card with room for it but
not for the earlier one (the seed asks that runs wait until memory frees, and leaves the order among them
open; holding memory for the earliest run at once would leave the card idle while that run waits).

Starvation is bounded the way docs/workers.md bounds it for device-set runs, by a hold (:class:`MemoryHolds`):
each time a run is placed on a card, the earliest waiting run that wants that card and could fit it once
it is empty (its budget + context <= the card's total) is *overtaken* there; after
``MEMORY_OVERTAKES_BEFORE_HOLD`` (3) overtakes on one card that run *holds* the card: no run submitted
after it starts there until it has started (or left the queue). The runs already on the card end, its
room grows, and the holder starts. Holds are fixed for the length of a pass and updated after it.

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
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ...constants import MEMORY_OVERTAKES_BEFORE_HOLD
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


@dataclass
class MemoryHolds:
    """Which waiting run holds which card (see the module docstring), and how often runs were overtaken.

    ``by_key``: card key -> the run id holding it; ``overtaken``: (run id, card key) -> overtakes so far.
    Pure bookkeeping: the planner says who was overtaken (:meth:`overtake`) and who left (:meth:`drop_run`)."""

    limit: int = MEMORY_OVERTAKES_BEFORE_HOLD
    by_key: dict[str, str] = field(default_factory=dict)
    overtaken: dict[tuple[str, str], int] = field(default_factory=dict)

    def holder(self, key: str) -> str | None:
        return self.by_key.get(key)

    def held_by(self, run_id: str) -> list[str]:
        return [k for k, r in self.by_key.items() if r == run_id]

    def overtake(self, run_id: str, key: str) -> bool:
        """``run_id`` was overtaken on ``key``; True when it now holds the card."""
        n = self.overtaken.get((run_id, key), 0) + 1
        self.overtaken[(run_id, key)] = n
        if n >= self.limit and key not in self.by_key:
            self.by_key[key] = run_id
            return True
        return False

    def drop_run(self, run_id: str) -> list[str]:
        """The run started or left the queue: its holds end (the keys it held are returned)."""
        keys = self.held_by(run_id)
        for k in keys:
            del self.by_key[k]
        for pair in [p for p in self.overtaken if p[0] == run_id]:
            del self.overtaken[pair]
        return keys

    def release(self, key: str) -> None:
        """The hold on ``key`` ends (its holder can no longer go there)."""
        run_id = self.by_key.pop(key, None)
        if run_id is not None:
            self.overtaken.pop((run_id, key), None)


def _could_hold(ledger: Ledger, key: str, budget: float) -> bool:
    """Whether a run of ``budget`` bytes could ever run on the shared card ``key`` (then it may hold it)."""
    card = ledger.cards.get(key)
    if card is None or not card.shared or card.total is None or budget == INF:
        return False
    return budget + ledger.context_for(card) <= card.total


def _blocked(holds: MemoryHolds | None, keys: Sequence[str], run_id: str, seq: int,
             seq_of: Callable[[str], int | None]) -> bool:
    """A candidate is blocked for a run when one of its cards is held by a run submitted before it."""
    if not holds or not holds.by_key:
        return False
    for key in keys:
        holder = holds.by_key.get(key)
        if holder is not None and holder != run_id:
            hs = seq_of(holder)
            if hs is not None and hs < seq:
                return True
    return False


def _first_fit(ledger: Ledger, run: MemoryRun, budget: int | None, holds: MemoryHolds | None = None,
               seq: int = 0, seq_of: Callable[[str], int | None] = lambda _r: None) -> int | None:
    for i, keys in enumerate(run.candidates):
        if ledger.candidate_status(keys, budget) == FITS and not _blocked(holds, keys, run.run_id, seq, seq_of):
            return i
    return None


def _check_holds(holds: MemoryHolds, ledger: Ledger, budgets: Mapping[str, float]) -> None:
    """Before a pass: a hold whose holder is gone, or whose budget could not fit the card, ends (the card
    is re-examined). ``budgets``: the waiting runs' budgets in bytes (INF: none)."""
    for key, run_id in list(holds.by_key.items()):
        budget = budgets.get(run_id)
        if budget is None or not _could_hold(ledger, key, budget):
            holds.release(key)
            ledger.grown.add(key)


def plan_reference(runs: Iterable[MemoryRun], ledger: Ledger, holds: MemoryHolds | None = None) -> list[MemoryPlacement]:
    """The rule as a full pass over ``runs`` (submission order); placed runs are reserved on ``ledger``.
    With ``holds`` the pass respects them and updates them after it (overtakes, new holds)."""
    runs = list(runs)
    seqs = {r.run_id: i for i, r in enumerate(runs)}
    budgets = {r.run_id: to_bytes(r.budget_gib) if r.budget_gib is not None else INF for r in runs}
    if holds is not None:
        for pair in [p for p in holds.overtaken if p[0] not in seqs]:
            del holds.overtaken[pair]  # runs that left the queue
        _check_holds(holds, ledger, budgets)
    out: list[MemoryPlacement] = []
    for i, run in enumerate(runs):
        budget = to_bytes(run.budget_gib) if run.budget_gib is not None else None
        c = _first_fit(ledger, run, budget, holds, i, seqs.get)
        if c is not None:
            keys = run.candidates[c]
            ledger.reserve(run.run_id, keys, run.budget_gib)
            out.append(MemoryPlacement(run.run_id, c, keys))
    if holds is not None and out:
        placed = {p.run_id for p in out}
        for p in out:
            holds.drop_run(p.run_id)
        for p in out:
            for key in p.keys:
                head = next((r for r in runs[:seqs[p.run_id]] if r.run_id not in placed
                             and any(key in c for c in r.candidates)
                             and _could_hold(ledger, key, budgets[r.run_id])), None)
                if head is not None:
                    holds.overtake(head.run_id, key)
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

    def __init__(self, ledger: Ledger, holds: MemoryHolds | None = None) -> None:
        self.ledger = ledger
        self.holds = holds if holds is not None else MemoryHolds()
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
        self._placed_seqs: dict[str, int] = {}  # runs placed by the current pass -> their seq
        self._drop_after: list[str] = []  # runs that left during the pass: their holds end after it
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

    def seq_of(self, run_id: str) -> int | None:
        return self._by_id.get(run_id)

    def remove(self, run_id: str) -> MemoryRun | None:
        seq = self._by_id.pop(run_id, None)
        if seq is None:
            return None
        run = self._runs.pop(seq)
        if self._planning:
            self._drop_after.append(run_id)  # holds stay as they were for the rest of the pass
        else:
            for key in self.holds.drop_run(run_id):
                self.ledger.grown.add(key)  # the runs after it may go there again
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
        if pos is None:
            return
        seq = cards.seqs[pos]
        holder = self.holds.by_key.get(key)
        if holder is not None:
            hs = self._seq_any(holder)
            if hs is not None and hs < seq:
                return  # the card is held for an earlier run: nothing after it starts here
        if seq <= self._upto:
            heapq.heappush(heap, (seq, key, pos))

    def _place(self, seq: int, out: list[MemoryPlacement]) -> bool:
        run = self._runs.get(seq)
        if run is None:
            return False
        budget = self._budget[seq]
        i = _first_fit(self.ledger, run, None if budget == INF else int(budget), self.holds, seq, self._seq_any)
        if i is None:
            return False
        keys = run.candidates[i]
        self.ledger.reserve(run.run_id, keys, run.budget_gib)
        out.append(MemoryPlacement(run.run_id, i, keys))
        self._placed_seqs[run.run_id] = seq
        self.remove(run.run_id)
        return True

    def plan(self) -> list[MemoryPlacement]:
        """Place what fits now (the placements of :func:`plan_reference` over :meth:`runs`); then count
        the overtakes of the pass (which may make a waiting run hold a card)."""
        if self.holds.by_key:
            holders = set(self.holds.by_key.values())
            _check_holds(self.holds, self.ledger,
                         {r: self._budget[self._by_id[r]] for r in holders if r in self._by_id})
        grown = self.ledger.pop_grown()
        out: list[MemoryPlacement] = []
        self._placed_seqs = {}
        self._drop_after = []
        self._planning = True
        try:
            self._pass(grown, out)
        finally:
            self._planning = False
        for run_id in self._drop_after:
            for key in self.holds.drop_run(run_id):
                self.ledger.grown.add(key)
        for key in self._to_compact:
            self._cards[key].compact(self._budget)
        self._to_compact = set()
        self._new = []
        self._recheck = []
        self._upto = self._seq
        for p in out:
            for key in p.keys:
                head = self._head(key, self._placed_seqs[p.run_id])
                if head is not None:
                    self.holds.overtake(self._runs[head].run_id, key)
        return out

    def _seq_any(self, run_id: str) -> int | None:
        """A run's seq, also for a run placed earlier in the current pass."""
        seq = self._by_id.get(run_id)
        return seq if seq is not None else self._placed_seqs.get(run_id)

    def _head(self, key: str, before: int) -> int | None:
        """The earliest waiting run (seq < ``before``) that wants ``key`` and could run there once it is empty."""
        cards = self._cards.get(key)
        card = self.ledger.cards.get(key)
        if cards is None or card is None or not card.shared or card.total is None:
            return None
        pos = cards.tree.first_at_most(card.total - self.ledger.context_for(card), 0)
        if pos is None or cards.seqs[pos] >= before:
            return None
        return cards.seqs[pos]

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
