"""SlotQueue: the slot rule decided incrementally (docs/sidecar.md), identical to :func:`plan.plan`.

The reference :func:`~.plan.plan` re-walks the whole queue on every pass; SlotQueue groups queued runs
by identical candidates and re-examines only the groups whose slots changed since its last pass
(``SlotState.changes_since``), so a pass costs what changed rather than the queue's length. A test
checks it against ``plan()`` decision by decision.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Mapping
from typing import Any

from .plan import (
    AdmitFn,
    Candidate,
    CandTable,
    Placement,
    Plan,
    PlanPass,
    QueuedRun,
    candidate_table,
    usable_provider,
)
from .state import SlotState


class _Group:
    """Queued runs with identical candidates, in submission order (they wait for the same slots)."""

    __slots__ = ("gid", "cands", "members", "alive", "pairs", "keys_for", "keys", "table", "pos_of")

    def __init__(self, gid: int, cands: tuple[Candidate, ...]) -> None:
        self.gid = gid
        self.cands = cands
        self.members: list[int] = []  # seqs, ascending; removed runs are skipped (and trimmed)
        self.alive = 0
        self.pairs = tuple(dict.fromkeys(pair for c in cands for pair in c.pairs))
        self.keys_for: int | None = None  # serial of the SlotState ``keys``/``table``/``pos_of`` are for
        self.keys: frozenset[str] = frozenset()
        self.table: CandTable = []
        self.pos_of: dict[str, tuple[int, ...]] = {}  # slot key -> startable table rows that take it

    def resolve(self, state: SlotState) -> None:
        """Cache the slots it could take through providers that can start runs, per state object
        (the dispatcher rebuilds the state, never edits its providers, when they change)."""
        if self.keys_for != state.serial:
            index, providers = state.index, state.providers
            self.keys = frozenset(k for pair in self.pairs
                                  if (k := index.get(pair)) is not None and usable_provider(providers.get(pair[0])))
            self.table = candidate_table(self.cands, state)
            pos: dict[str, list[int]] = {}
            for i, (_, _, keys, startable) in enumerate(self.table):
                if startable:
                    for key in keys:
                        pos.setdefault(key, []).append(i)  # type: ignore[arg-type]
            self.pos_of = {k: tuple(v) for k, v in pos.items()}
            self.keys_for = state.serial


SMALL_TABLE = 8  # a run with at most this many candidates is re-checked candidate by candidate
FEW_NEW = 32  # up to this many runs submitted since the last pass are looked at one by one


class SlotQueue:
    """The queue in submission order, grouped by candidates and indexed by (provider, device), so a
    pass only looks at runs that could take a slot with a free unit. Runs with the same candidates
    (every "any CUDA card" run, every run for gpu-box's cuda:1) form one group; within a group only
    the earliest runs are looked at, because the later ones want exactly the same slots.

    :meth:`plan` gives the same placements and reservations as :func:`plan` over the runs in order
    (the tests check this on random worlds); ``waiting`` explains the runs it looked at.

    The steady state (one run ends, one decision) is incremental. After a pass whose placements are
    applied (the runs removed, their slots held), planning again changes nothing: the same device-set
    runs hold the same free units, so the queue keeps that outcome per slot (which runs hold a unit of
    it, in submission order). The next pass starts from what changed since: slots whose free units
    differ (read from the state's change log), holders removed from the queue, runs submitted since.
    It walks forward in submission order from the first run that wants a changed slot, re-deciding
    only runs that want a slot whose free units at their turn differ from last time, and stops when
    no difference is left; then it looks at the new runs. The previous outcome is only reused for
    the same state object, without ``admit`` (an outside predicate may change its mind at any time)
    and without ``explain``; otherwise, or when a placement was not applied, a full pass runs.
    """

    def __init__(self) -> None:
        self._by_id: dict[str, int] = {}
        self._by_seq: dict[int, QueuedRun] = {}
        self._group_of: dict[int, _Group] = {}
        self._groups: dict[tuple[Candidate, ...], _Group] = {}
        self._group_ids: dict[int, _Group] = {}
        self._by_pair: dict[tuple[str, str], set[int]] = {}  # -> group ids
        self._seq = 0
        self._gid = 0
        # The outcome of the last pass, for the incremental one (see the class doc). It is valid for
        # the SlotState with serial ``_serial`` as of its change number ``_version``.
        self._serial: int | None = None
        self._version = 0
        self._upto = 0  # runs with seq <= _upto were in the queue at the last pass
        self._new: list[int] = []  # seqs submitted since the last pass
        self._units: dict[str, int] = {}  # slot key -> free units in the state once placements are held
        self._takers: dict[str, list[int]] = {}  # slot key -> seqs of waiting runs holding a unit, ascending
        self._takes: dict[int, tuple[str, ...]] = {}  # seq of a waiting device-set run -> slot keys it holds
        self._spare: dict[str, int] = {}  # slot key -> units still free after every queued run
        self._reserved: dict[str, str] = {}  # slot key -> first run holding a unit of it (Plan.reserved)
        self._removed: list[tuple[int, tuple[str, ...]]] = []  # holders removed since: (seq, slot keys)
        self._placed: dict[int, tuple[str, ...]] = {}  # runs the last pass placed -> their slot keys

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, run_id: object) -> bool:
        return run_id in self._by_id

    def __iter__(self):  # noqa: ANN204 - Iterator[QueuedRun], in submission order
        return iter(list(self._by_seq.values()))

    def get(self, run_id: str) -> QueuedRun | None:
        seq = self._by_id.get(run_id)
        return self._by_seq.get(seq) if seq is not None else None

    def position(self, run_id: str) -> int | None:
        """1-based place in the queue (O(n): for status pages, not for the hot path)."""
        seq = self._by_id.get(run_id)
        if seq is None:
            return None
        return 1 + sum(1 for s in self._by_seq if s < seq)

    def add(self, run: QueuedRun) -> None:
        if run.run_id in self._by_id:
            raise ValueError(f"run {run.run_id} is queued already")
        self._seq += 1
        seq = self._seq
        group = self._groups.get(run.candidates)
        if group is None:
            self._gid += 1
            group = self._groups[run.candidates] = self._group_ids[self._gid] = _Group(self._gid, run.candidates)
            for pair in group.pairs:
                self._by_pair.setdefault(pair, set()).add(group.gid)
        elif run.candidates is not group.cands:
            # Share one candidates tuple per group: 2,000 "any card" runs on a 512-card fleet would
            # otherwise hold a million Candidate objects (memory, and garbage-collector pauses).
            run = QueuedRun(run.run_id, group.cands)
        self._by_id[run.run_id] = seq
        self._by_seq[seq] = run
        group.members.append(seq)
        group.alive += 1
        self._group_of[seq] = group
        self._new.append(seq)

    def remove(self, run_id: str) -> QueuedRun | None:
        seq = self._by_id.pop(run_id, None)
        if seq is None:
            return None
        run = self._by_seq.pop(seq)
        keys = self._takes.pop(seq, None)
        if keys:  # a waiting device-set run that held free units: the next pass hands them on
            self._removed.append((seq, keys))
        group = self._group_of.pop(seq)
        group.alive -= 1
        if group.alive == 0:
            del self._groups[group.cands]
            del self._group_ids[group.gid]
            for pair in group.pairs:
                gids = self._by_pair[pair]
                gids.discard(group.gid)
                if not gids:
                    del self._by_pair[pair]
        elif group.members[0] == seq:  # the usual case: the group's first run starts or is cancelled
            members, k = group.members, 1
            while k < len(members) and members[k] not in self._by_seq:
                k += 1
            del members[:k]
        elif len(group.members) > 2 * group.alive + 64:
            group.members = [m for m in group.members if m in self._by_seq]
        return run

    # --- planning -------------------------------------------------------------------------------

    def plan(self, state: SlotState, admit: AdmitFn | None = None, explain: bool = True) -> Plan:
        """The pass of :func:`plan` over the queued runs in ``state`` (``state`` is not modified).

        Without ``admit`` and ``explain`` (the dispatcher's hot path) it continues from the previous
        pass (see the class doc); the caller applies the placements (``remove`` the runs, ``hold``
        their slots on ``state``) as before."""
        known: list[Placement] = []
        blocked: list[Any] = []
        examined = 0
        if admit is None and not explain and self._can_continue(state):
            examined = self._replan_known(state, known, blocked)
        else:
            self._restart(state)
        p = PlanPass(state, admit, explain, free=dict(self._spare))
        p.result.reserved = dict(self._reserved)
        p.result.placements = known  # the new runs' placements follow
        p.result.blocked = blocked
        n_known = len(known)
        examined += self._plan_new(p, state)
        p.result.examined = examined
        self._record(p, n_known, state, reusable=admit is None)
        return p.result

    def _can_continue(self, state: SlotState) -> bool:
        """Whether the last pass's outcome describes ``state`` and this queue (but for the changes
        that the log and ``remove``/``add`` tell)."""
        if self._serial != state.serial or state.repeated_keys or state.changes_since(self._version) is None:
            return False
        alive = self._by_seq
        return not any(seq in alive for seq in self._placed)  # a placement left queued: start over

    def _restart(self, state: SlotState) -> None:
        """Forget the last pass: the next one looks at every run, from the state's free units."""
        self._units = {k: state.slots[k].limit - state.slots[k].used for k in state.free_keys}
        self._spare = dict(self._units)
        self._takers, self._takes, self._reserved = {}, {}, {}
        self._removed, self._placed = [], {}
        self._upto = 0

    def _replan_known(self, state: SlotState, placements: list[Placement], blocked: list[Any]) -> int:
        """Re-decide the runs queued at the last pass whose slots' free units at their turn changed.

        ``dirty`` maps a slot key to (free units at the current point of the walk) minus (the same
        in the last pass): a run that wants no dirty slot decides as last time, so the walk goes from
        one run that wants a dirty slot to the next, in submission order, until nothing is dirty.
        Returns the number of runs re-decided; ``placements``/``blocked`` receive their outcome."""
        units, takers = self._units, self._takers
        touched: set[str] = set()
        dirty: dict[str, int] = {}
        check = set(state.changes_since(self._version) or ())
        for keys in self._placed.values():  # expected to be held now; a failed start leaves them free
            check.update(keys)
        slots, free_keys = state.slots, state.free_keys
        for key in check:
            actual = slots[key].limit - slots[key].used if key in free_keys else 0
            delta = actual - units.get(key, 0)
            if delta:
                if actual > 0:
                    units[key] = actual
                else:
                    units.pop(key, None)
                dirty[key] = delta
                touched.add(key)
        # Events in submission order: (seq, 0, keys) a removed holder gives its units back at its
        # turn; (seq, 1, key) the run ``seq`` is the next one that wants the dirty slot ``key``.
        heap: list[tuple[int, int, Any]] = []
        for seq, keys in self._removed:
            for key in keys:
                held = takers[key]
                del held[bisect_left(held, seq)]
                touched.add(key)
            heap.append((seq, 0, keys))
        self._removed = []
        upto = self._upto
        sched: dict[str, int] = {}  # dirty key -> the run its pending event names

        def follow(key: str, after: int) -> None:
            seq = self._next_wanting(state, key, after, upto)
            if seq is not None:
                sched[key] = seq
                heapq.heappush(heap, (seq, 1, key))

        heapq.heapify(heap)
        for key in list(dirty):
            follow(key, 0)
        placed: dict[int, tuple[str, ...]] = {}
        last = examined = 0
        while heap:
            seq, kind, payload = heapq.heappop(heap)
            if kind == 0:
                for key in payload:
                    diff = dirty.get(key, 0) + 1
                    if diff:
                        dirty[key] = diff
                        if key not in sched:
                            follow(key, seq)
                    else:
                        del dirty[key]
                continue
            key = payload
            if sched.get(key) != seq:
                continue  # stale: the key was rescheduled
            del sched[key]
            if key not in dirty:
                continue
            if seq != last:
                last = seq
                examined += 1
                for changed in self._redecide(seq, state, dirty, placements, blocked, placed):
                    touched.add(changed)
                    if changed in dirty and changed not in sched:
                        follow(changed, seq)
            if key in dirty and key not in sched:
                follow(key, seq)
        for seq, keys in placed.items():  # the caller holds them: units go, the run leaves the queue
            for key in keys:
                touched.add(key)
                held = takers[key]
                del held[bisect_left(held, seq)]
                left = units[key] - 1
                if left > 0:
                    units[key] = left
                else:
                    del units[key]
        self._placed = placed
        self._refresh(touched)
        return examined

    def _next_wanting(self, state: SlotState, key: str, after: int, upto: int) -> int | None:
        """The first queued run with ``after < seq <= upto`` that could take ``key`` (through a
        provider that can start runs), or None."""
        best: int | None = None
        providers, alive, groups = state.providers, self._by_seq, self._group_ids
        for pair in state.pairs_of.get(key, ()):
            gids = self._by_pair.get(pair)
            if not gids or not usable_provider(providers.get(pair[0])):
                continue
            for gid in gids:
                members = groups[gid].members
                for i in range(bisect_right(members, after), len(members)):
                    m = members[i]
                    if m > upto or (best is not None and m >= best):
                        break
                    if m in alive:
                        best = m
                        break
        return best

    def _redecide(self, seq: int, state: SlotState, dirty: dict[str, int], placements: list[Placement],
                  blocked: list[Any], placed: dict[int, tuple[str, ...]]) -> list[str]:
        """Decide run ``seq`` again with the free units at its turn; update the holders and ``dirty``;
        return the slot keys whose holders changed."""
        run = self._by_seq[seq]
        group = self._group_of[seq]
        group.resolve(state)
        table = group.table
        units, takers = self._units, self._takers

        def free_at(key: str) -> int:  # free units of ``key`` when this run's turn comes
            held = takers.get(key)
            return units.get(key, 0) - (bisect_left(held, seq) if held else 0)

        if len(table) <= SMALL_TABLE:
            rows: Iterable[int] = range(len(table))
        else:
            # Last time no candidate had every slot free, so one that has now takes a dirty slot.
            pos_of = group.pos_of
            rows = sorted({i for key in dirty if (found := pos_of.get(key)) for i in found})
        chosen = None
        for i in rows:
            entry = table[i]
            if entry[3] and all(free_at(k) > 0 for k in entry[2]):  # type: ignore[arg-type]
                chosen = entry
                break
        old = self._takes.pop(seq, ())
        new: tuple[str, ...] = ()
        if chosen is not None:
            cand, _, keys, _ = chosen
            new = keys  # type: ignore[assignment]
            placements.append(Placement(run.run_id, cand.provider, cand.devices, new, cand.extra))
            placed[seq] = new
        else:
            held_devices: list[str] = []
            if run.is_device_set:  # it holds what is free of its first candidate that could start
                entry = next((e for e in table if e[3]), None)
                if entry is not None:
                    new = tuple(k for k in entry[2] if free_at(k) > 0)  # type: ignore[arg-type]
                    held_devices = [d for d, k in zip(entry[0].labels(), entry[2], strict=True) if k in new]
                    if new:
                        self._takes[seq] = new
            blocked.append((run, table, tuple(held_devices), []))
        changed: list[str] = []
        for key in old:
            if key not in new:
                held = takers[key]
                del held[bisect_left(held, seq)]
                _bump(dirty, key, 1)
                changed.append(key)
        for key in new:
            if key not in old:
                held = takers.setdefault(key, [])
                held.insert(bisect_left(held, seq), seq)
                _bump(dirty, key, -1)
                changed.append(key)
        return changed

    def _plan_new(self, p: PlanPass, state: SlotState) -> int:
        """Look at the runs submitted since the last pass (every run after a restart), in order."""
        alive = self._by_seq
        if not self._upto or len(self._new) > FEW_NEW:
            return self._heap_pass(p, state, self._upto)
        examined = 0
        free_set = p.free_set
        for seq in self._new:
            if not free_set:
                break
            run = alive.get(seq)
            if run is None:
                continue
            group = self._group_of[seq]
            group.resolve(state)
            if free_set.isdisjoint(group.keys):
                continue
            examined += 1
            p.examine(run, group.table, group.keys)
        return examined

    def _heap_pass(self, p: PlanPass, state: SlotState, after: int) -> int:
        """The pass over runs with seq > ``after``: groups that want a free slot, merged by their
        earliest queued run, each dropped once every slot it could use is taken."""
        alive = self._by_seq
        providers = state.providers
        # Groups that want a slot with a free unit, through a provider that can start runs.
        wanted: set[int] = set()
        for key in p.free_set:
            for pair in state.pairs_of.get(key, ()):
                groups = self._by_pair.get(pair)
                if groups and usable_provider(providers.get(pair[0])):
                    wanted |= groups
        heap: list[tuple[int, int, _Group]] = []
        for group in map(self._group_ids.__getitem__, wanted):
            i = _next_alive(group.members, bisect_right(group.members, after) if after else 0, alive)
            if i is not None:
                heap.append((group.members[i], i, group))
        heapq.heapify(heap)
        examined = 0
        free_set = p.free_set
        while heap:
            seq, i, group = heapq.heappop(heap)
            group.resolve(state)
            if free_set.isdisjoint(group.keys):
                continue  # every slot it could use was taken meanwhile: the rest of the group waits too
            examined += 1
            p.examine(alive[seq], group.table, group.keys)
            j = _next_alive(group.members, i + 1, alive)
            if j is not None:
                heapq.heappush(heap, (group.members[j], j, group))
        return examined

    def _record(self, p: PlanPass, known: int, state: SlotState, reusable: bool) -> None:
        """Keep the outcome of pass ``p`` (placements after the first ``known`` came from new runs)
        for the next one, as it will be once the caller has applied the placements."""
        units, takers, by_id = self._units, self._takers, self._by_id
        touched: set[str] = set()
        for run_id, keys in p.reservations:
            seq = by_id[run_id]
            self._takes[seq] = keys
            for key in keys:
                takers.setdefault(key, []).append(seq)  # the latest seq so far: the lists stay sorted
                touched.add(key)
        for placement in p.result.placements[known:]:
            self._placed[by_id[placement.run_id]] = placement.slot_keys
            for key in placement.slot_keys:
                left = units[key] - 1
                if left > 0:
                    units[key] = left
                else:
                    del units[key]
                touched.add(key)
        self._refresh(touched, reserved=False)
        self._reserved = dict(p.result.reserved)
        self._upto = self._seq
        self._new = []
        self._serial = state.serial if reusable and not state.repeated_keys else None
        self._version = state.version

    def _refresh(self, keys: Iterable[str], reserved: bool = True) -> None:
        """Recompute the spare units (and with ``reserved`` the first holder) of ``keys``."""
        units, takers, spare = self._units, self._takers, self._spare
        for key in keys:
            held = takers.get(key)
            if held is not None and not held:
                del takers[key]
                held = None
            left = units.get(key, 0) - (len(held) if held else 0)
            if left > 0:
                spare[key] = left
            else:
                spare.pop(key, None)
            if reserved:
                if held:
                    self._reserved[key] = self._by_seq[held[0]].run_id
                else:
                    self._reserved.pop(key, None)


def _bump(counts: dict[str, int], key: str, by: int) -> None:
    """Add ``by`` to ``counts[key]``, dropping the entry at zero."""
    value = counts.get(key, 0) + by
    if value:
        counts[key] = value
    else:
        del counts[key]


def _next_alive(members: list[int], start: int, alive: Mapping[int, Any]) -> int | None:
    for i in range(start, len(members)):
        if members[i] in alive:
            return i
    return None

