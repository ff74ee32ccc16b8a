"""The queue and the reference plan (docs/sidecar.md): submission order, device sets reserve at the head."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .offers import ProviderInfo
from .state import SlotState
from .waiting import busy_reason, provider_reason, waiting_text

# --- the queue and the plan -----------------------------------------------------------------------------


Part = tuple[str, tuple[str, ...]]  # (provider, the provider's names of the devices it takes)


@dataclass(frozen=True)
class Candidate:
    """One way to run: a provider and the provider's names of the devices to take (all at once).

    ``extra``: the other workers' parts of a run spread over workers (ddp across workers,
    docs/architecture.md "ddp across workers"): the run takes every device of every part at once."""

    provider: str
    devices: tuple[str, ...]
    extra: tuple[Part, ...] = ()

    @property
    def parts(self) -> tuple[Part, ...]:
        """Every (provider, devices) the candidate takes, its own provider first."""
        return ((self.provider, self.devices), *self.extra)

    @functools.cached_property
    def pairs(self) -> tuple[tuple[str, str], ...]:
        """Every (provider, device) the candidate takes, in order."""
        return tuple((p, d) for p, devs in self.parts for d in devs)

    def labels(self) -> list[str]:
        """Its devices as a waiting_reason names them (``b/cuda:0`` when it spans workers)."""
        return [f"{p}/{d}" for p, d in self.pairs] if self.extra else list(self.devices)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"provider": self.provider, "devices": list(self.devices)}
        if self.extra:
            out["spread"] = [{"provider": p, "devices": list(devs)} for p, devs in self.extra]
        return out

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Candidate:
        extra = tuple((str(x["provider"]), tuple(str(d) for d in x["devices"])) for x in data.get("spread") or ())
        return Candidate(str(data["provider"]), tuple(str(d) for d in data["devices"]), extra)


@dataclass(frozen=True)
class QueuedRun:
    """A run waiting for slots; the queue passed to :func:`plan` is in submission order."""

    run_id: str
    candidates: tuple[Candidate, ...]

    @functools.cached_property
    def is_device_set(self) -> bool:
        return any(len(c.devices) > 1 or c.extra for c in self.candidates)


@dataclass(frozen=True)
class Placement:
    run_id: str
    provider: str
    devices: tuple[str, ...]
    slot_keys: tuple[str, ...]
    extra: tuple[Part, ...] = ()  # the other workers' parts of a spread run (Candidate.extra)


@dataclass
class Plan:
    """The outcome of one pass.

    ``waiting`` has a reason for each run examined but not placed (only with ``explain``);
    ``examined`` counts runs looked at: the pass stops early once every slot is taken or reserved,
    and the runs after that all wait for a slot. ``reserved`` maps slot key -> the device-set run
    holding it at the head of the queue.
    """

    placements: list[Placement] = field(default_factory=list)
    waiting: dict[str, str] = field(default_factory=dict)
    reserved: dict[str, str] = field(default_factory=dict)
    examined: int = 0
    blocked: list[Any] = field(default_factory=list, repr=False, compare=False)  # explain=False: texts later
    _pass: Any = field(default=None, repr=False, compare=False)

    def reasons(self) -> dict[str, str]:
        """Why each run the pass looked at but did not place waits. With ``explain=False`` the texts
        are made here, on demand, from the pass's end state (the hot path makes no strings)."""
        out = dict(self.waiting)
        for run, table, held, refusals in self.blocked:
            out.setdefault(run.run_id, self._pass.text_for(table, held, refusals, run.run_id))
        return out

    def explain(self, run: QueuedRun) -> str:
        """Why ``run`` waits after this pass (looked at or not)."""
        if run.run_id in self.waiting:
            return self.waiting[run.run_id]
        for blocked_run, table, held, refusals in self.blocked:
            if blocked_run.run_id == run.run_id:
                return self._pass.text_for(table, held, refusals, run.run_id)
        if self._pass is None:
            return "waiting for a free slot"
        p = PlanPass(self._pass.state, None, True)
        p.free = dict(self._pass.free)
        p.free_set = set(self._pass.free_set)
        p.result.reserved = dict(self.reserved)
        p.examine(run)
        if p.result.placements:
            return "waiting for the next scheduling pass"
        return p.result.waiting.get(run.run_id, "waiting for a free slot")


AdmitResult = bool | str | None
AdmitFn = Callable[[QueuedRun, Candidate], AdmitResult]
"""Extra admission predicate: ``True``/``None`` admits; ``False`` or a reason string makes the run wait."""


def usable_provider(prov: ProviderInfo | None) -> bool:
    return prov is not None and prov.online and not prov.draining


CandTable = list[tuple[Candidate, "ProviderInfo | None", tuple["str | None", ...], bool]]
MAX_REASONS = 3  # reasons spelled out in a waiting_reason; the rest are counted


def candidate_table(cands: Sequence[Candidate], state: SlotState) -> CandTable:
    """Each candidate with its provider, its devices' slot keys (None: no longer offered), and whether
    a run could ever start through it now (provider online, not draining, every device offered; for
    a spread candidate, every part's provider and device)."""
    index, providers = state.index, state.providers
    out: CandTable = []
    for c in cands:
        prov = providers.get(c.provider)
        if c.extra:
            keys = tuple(index.get(pair) for pair in c.pairs)
            usable = all(usable_provider(providers.get(p)) for p, _ in c.extra)
            out.append((c, prov, keys, usable and usable_provider(prov) and None not in keys))
            continue
        keys = tuple(index.get((c.provider, d)) for d in c.devices)
        out.append((c, prov, keys, usable_provider(prov) and None not in keys))
    return out


class PlanPass:
    """The bookkeeping of one planning pass: free units per slot, reservations, the result.
    ``examine`` applies the rule to one run."""

    def __init__(self, state: SlotState, admit: AdmitFn | None, explain: bool,
                 free: dict[str, int] | None = None) -> None:
        self.state = state
        self.admit = admit
        self.explain = explain
        # Free units of every placeable slot that has some; other slots have none. ``free`` (owned by
        # the pass from then on) starts the pass from another point, e.g. after the runs before it.
        if free is None:
            free = {k: state.slots[k].limit - state.slots[k].used for k in state.free_keys}
        self.free: dict[str, int] = free
        self.free_set: set[str] = {k for k, n in free.items() if n > 0}  # keys with a free unit left
        self.reservations: list[tuple[str, tuple[str, ...]]] = []  # (run id, slot keys) of held units
        self.result = Plan()
        self.result._pass = self

    def free_units(self, key: str) -> int:
        return self.free.get(key, 0)

    def total_free(self) -> int:
        return sum(self.free.values())

    def _take(self, key: str) -> None:
        left = self.free[key] - 1
        self.free[key] = left
        if left <= 0:
            self.free_set.discard(key)

    def examine(self, run: QueuedRun, table: CandTable | None = None, keyset: frozenset[str] | None = None) -> int:
        """Place ``run`` or record why it waits; return how many free units it took (placed or reserved).

        ``table``/``keyset`` (the run's candidates resolved against the state, and all their slot keys)
        may be passed in when cached."""
        if table is None:
            table = candidate_table(run.candidates, self.state)
        free_set = self.free_set
        explain = self.explain
        reasons: list[str] = []  # admission refusals
        chosen: Placement | None = None
        hopeless = keyset is not None and free_set.isdisjoint(keyset)  # nothing it wants is free
        if not hopeless:
            for cand, prov, keys, startable in table:
                if not startable:
                    continue
                if len(keys) == 1:
                    if keys[0] not in free_set:
                        continue
                elif not free_set.issuperset(keys):
                    continue
                if self.admit is not None:
                    verdict = self.admit(run, cand)
                    if verdict is not True and verdict is not None:
                        reasons.append(verdict if isinstance(verdict, str) else f"{prov.label} did not admit it")
                        continue
                chosen = Placement(run.run_id, cand.provider, cand.devices, keys, cand.extra)  # type: ignore[arg-type]
                break
        if chosen is not None:
            for key in chosen.slot_keys:
                self._take(key)
            self.result.placements.append(chosen)
            return len(chosen.slot_keys)
        held: list[str] = []
        if run.is_device_set:
            # It holds what is free of the first candidate that could ever start (see the module doc).
            entry = next((e for e in table if e[3]), None)
            if entry is not None:
                taken: list[str] = []
                for dev, key in zip(entry[0].labels(), entry[2], strict=True):
                    if key in free_set:
                        self._take(key)  # type: ignore[arg-type]
                        self.result.reserved.setdefault(key, run.run_id)  # type: ignore[arg-type]
                        held.append(dev)
                        taken.append(key)  # type: ignore[arg-type]
                if taken:
                    self.reservations.append((run.run_id, tuple(taken)))
        if explain:
            self.result.waiting[run.run_id] = self.text_for(table, held, reasons, run.run_id)
        else:
            self.result.blocked.append((run, table, tuple(held), reasons))
        return len(held)

    def text_for(self, table: CandTable, held: Sequence[str], reasons: list[str], run_id: str = "") -> str:
        """The waiting_reason of a run this pass did not place (``reasons``: admission refusals)."""
        reasons = list(reasons)
        extra = 0
        for cand, prov, keys, _ in table:
            if len(reasons) >= MAX_REASONS:
                extra += 1
                continue
            reason = self._why(cand, prov, keys, run_id)
            if reason is not None and reason not in reasons:
                reasons.append(reason)
        return waiting_text(reasons, list(held), extra)

    def _why(self, cand: Candidate, prov: ProviderInfo | None, keys: tuple[str | None, ...],
             run_id: str = "") -> str | None:
        providers = self.state.providers
        for name, _ in cand.parts:  # a spread candidate waits for every part's worker
            p = prov if name == cand.provider else providers.get(name)
            if p is None or not p.online or p.draining:
                return provider_reason(name, p)
        for (name, dev), key in zip(cand.pairs, keys, strict=True):
            if key is None:
                return f"{providers[name].label} no longer offers {dev}"
        reserved = self.result.reserved
        busy = [busy_reason(self.state, providers[name], dev, key, reserved)
                for (name, dev), key in zip(cand.pairs, keys, strict=True)
                if key is not None and self.free.get(key, 0) <= 0 and reserved.get(key) != run_id]
        return "; ".join(busy) if busy else None


def plan(
    queue: Sequence[QueuedRun],
    state: SlotState,
    admit: AdmitFn | None = None,
    explain: bool = True,
    stop_when_full: bool = True,
) -> Plan:
    """Place queued runs on free slots, in submission order (see the module docstring).

    ``state`` is not modified. Each candidate of a run is tried in order; the first whose provider is
    online and not draining, whose every slot has a free unit, and that ``admit`` accepts, wins.
    With ``stop_when_full`` (the default) the pass ends as soon as no slot has a free unit left.
    This is the reference form of the rule; :class:`SlotQueue` gives the same placements without
    looking at runs that want only busy slots.
    """
    p = PlanPass(state, admit, explain)
    total_free = p.total_free()
    i = 0
    for run in queue:
        if total_free <= 0 and stop_when_full:
            break
        i += 1
        total_free -= p.examine(run)
    p.result.examined = i
    return p.result


def explain_wait(run: QueuedRun, state: SlotState) -> str:
    """Why ``run`` waits in ``state`` (looks at the run's own slots only: cheap)."""
    return Plan(_pass=PlanPass(state, None, True)).explain(run)


