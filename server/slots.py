"""The slot rule (SPEC Q5) and target resolution (SPEC Q3) as pure functions: no I/O, no clock.

Vocabulary
----------
* A **provider** offers devices and starts runs: the sidecar itself (provider ``local``) or a worker
  agent (provider = the worker's name). :class:`ProviderInfo` is what the rule needs to know about one.
* A **slot** is one physical device. Its key is the device's UUID when the provider reported one, else
  ``"<provider>/<device>"``. One physical card offered by several providers (the sidecar and a worker on
  the same machine, or two agents on one GPU server) is ONE slot: every run through any of them counts
  against it, and its limit is the smallest limit among the providers offering it that are online.
* A provider's limit for one of its devices: an override from ``XPUFLEET_RUN_QUEUE_MAX_CONCURRENT``
  (``cuda:0=2`` = this server's cuda:0, ``gpu-box/cuda:1=3`` = worker gpu-box's cuda:1), else 1 for an
  accelerator and 2 for a CPU. A worker without its own override on a card the sidecar also offers
  (same UUID) uses the sidecar's override for that card, so ``cuda:0=2`` raises it too.
* A **queued run** lists its **candidates** in preference order: each is a provider plus the provider's
  names of the devices the run would take (one device, or a device set taking every slot at once).

:func:`plan` walks the queue in submission order and places every run whose slots are free. A device-set
run that cannot start takes (reserves) whatever of its slots is free as it waits, so runs submitted after
it cannot take those slots and a stream of single-card runs cannot starve it. An optional ``admit``
callback is an extra admission predicate (the memory ledger of SPEC M plugs in there).

:func:`resolve_target` turns ``options.target`` / ``options.device`` into candidates (SPEC Q3), with the
exact 400 wording of the seed, and ``device_fallback`` warnings for a local run whose device is missing.
"""

from __future__ import annotations

import functools
import heapq
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..constants import (
    ACCELERATOR_KINDS,
    ACCELERATOR_SLOT_LIMIT,
    CPU_SLOT_LIMIT,
    LOCAL_PROVIDER,
    MAX_DEVICE_SET,
)

LOCAL = LOCAL_PROVIDER

# --- device names -----------------------------------------------------------------------------------

_DEVICE_RE = re.compile(r"^(cpu|cuda|xpu|mps)(?::(\d+))?$")
_WORKER_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def normalize_device(name: Any, *, allow_kind: bool = True, allow_auto: bool = False) -> str:
    """Canonical device name (``cuda:0``, ``cpu``, ``mps:0``, or a bare kind such as ``cuda``).

    Raises ValueError saying what is accepted. ``mps`` is ``mps:0`` (there is one MPS device); ``cpu``
    takes no index. A bare kind (``cuda``) is "any card of that kind" and only allowed with
    ``allow_kind``; ``auto`` only with ``allow_auto``.
    """
    if not isinstance(name, str):
        raise ValueError(f"a device name must be a string like 'cuda:0', got {name!r}")
    text = name.strip().lower()
    if allow_auto and text == "auto":
        return "auto"
    m = _DEVICE_RE.match(text)
    if not m:
        accepted = "cpu, cuda:N, xpu:N, mps" + (", cuda, xpu" if allow_kind else "") + (", auto" if allow_auto else "")
        raise ValueError(f"invalid device {name!r}: use {accepted}")
    kind, index = m.group(1), m.group(2)
    if kind == "cpu":
        if index is not None:
            raise ValueError(f"invalid device {name!r}: cpu takes no index, write 'cpu'")
        return "cpu"
    if kind == "mps":
        if index not in (None, "0"):
            raise ValueError(f"invalid device {name!r}: there is one MPS device, write 'mps'")
        return "mps:0"
    if index is None:
        if not allow_kind:
            raise ValueError(f"invalid device {name!r}: name one card, e.g. '{kind}:0'")
        return kind
    return f"{kind}:{int(index)}"


def device_kind(name: str) -> str:
    """``cuda:1`` -> ``cuda``; ``cpu`` -> ``cpu``."""
    return name.split(":", 1)[0]


def is_accelerator(name: str) -> bool:
    return device_kind(name) in ACCELERATOR_KINDS


def default_limit(kind: str) -> int:
    """Runs one slot holds when nothing overrides it: accelerator 1, CPU 2 (SPEC Q5)."""
    return CPU_SLOT_LIMIT if kind == "cpu" else ACCELERATOR_SLOT_LIMIT


def short_id(run_id: str) -> str:
    return run_id[:8]


# --- providers ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceOffer:
    """One device a provider offers, by the provider's own name for it."""

    name: str
    kind: str = ""
    uuid: str | None = None
    total_gib: float | None = None

    def __post_init__(self) -> None:
        if not self.kind:
            object.__setattr__(self, "kind", device_kind(self.name))


@dataclass(frozen=True)
class ProviderInfo:
    """What the slot rule and target resolution know about a provider.

    ``online``: connected now (the sidecar is always online). ``draining``: takes no new runs.
    Workers that connected once since the server started stay known while offline (their runs wait).
    """

    name: str
    devices: tuple[DeviceOffer, ...]
    online: bool = True
    draining: bool = False
    is_local: bool = False

    @property
    def label(self) -> str:
        return "this server" if self.is_local else f"worker {self.name}"

    def device_names(self) -> list[str]:
        return [d.name for d in self.devices]

    def where(self, device: str) -> str:
        """``cuda:0 on this server`` / ``cuda:1 on gpu-box``."""
        return f"{device} on this server" if self.is_local else f"{device} on {self.name}"


# --- limits ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LimitOverrides:
    """Parsed ``XPUFLEET_RUN_QUEUE_MAX_CONCURRENT``: this server's devices and workers' devices."""

    local: Mapping[str, int] = field(default_factory=dict)
    workers: Mapping[tuple[str, str], int] = field(default_factory=dict)


def parse_limits(text: str | None) -> tuple[LimitOverrides, list[str]]:
    """Parse ``"cuda:0=2,gpu-box/cuda:1=3"``; return the overrides and one warning per skipped entry.

    A malformed entry (no ``=``, a limit that is not an integer >= 1, an unknown device, a bare kind,
    a bad worker name) is skipped; the caller logs the warnings. Empty entries are ignored.
    """
    local: dict[str, int] = {}
    workers: dict[tuple[str, str], int] = {}
    warnings: list[str] = []
    for raw in (text or "").split(","):
        entry = raw.strip()
        if not entry:
            continue
        where, sep, value = entry.partition("=")
        if not sep:
            warnings.append(f"skipped {entry!r}: write DEVICE=N or WORKER/DEVICE=N, e.g. cuda:0=2")
            continue
        try:
            limit = int(value.strip())
        except ValueError:
            warnings.append(f"skipped {entry!r}: the limit {value.strip()!r} is not an integer")
            continue
        if limit < 1:
            warnings.append(f"skipped {entry!r}: the limit must be at least 1")
            continue
        worker, slash, device = where.strip().rpartition("/")
        if slash and not _WORKER_NAME_RE.match(worker.strip()):
            warnings.append(f"skipped {entry!r}: {worker.strip()!r} is not a worker name")
            continue
        try:
            dev = normalize_device(device.strip(), allow_kind=False)
        except ValueError as exc:
            warnings.append(f"skipped {entry!r}: {exc}")
            continue
        worker = worker.strip()
        if not slash or worker == LOCAL:
            key_desc = dev
            if dev in local:
                warnings.append(f"{entry!r} overrides an earlier entry for {key_desc}")
            local[dev] = limit
        else:
            if (worker, dev) in workers:
                warnings.append(f"{entry!r} overrides an earlier entry for {worker}/{dev}")
            workers[(worker, dev)] = limit
    return LimitOverrides(local, workers), warnings


def provider_limit(
    provider: ProviderInfo, offer: DeviceOffer, overrides: LimitOverrides, local_by_uuid: Mapping[str, str]
) -> int:
    """The limit ``provider`` applies to ``offer`` (before the several-providers minimum)."""
    value: int | None
    if provider.is_local:
        value = overrides.local.get(offer.name)
    else:
        value = overrides.workers.get((provider.name, offer.name))
        if value is None and offer.uuid and offer.uuid in local_by_uuid:
            # A same-machine worker without its own override follows this server's limit for the card.
            value = overrides.local.get(local_by_uuid[offer.uuid])
    return default_limit(offer.kind) if value is None else value


# --- slot state -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SlotOffer:
    provider: str
    device: str
    limit: int
    online: bool
    draining: bool


@dataclass
class Slot:
    """One physical device; ``limit`` is the smallest limit among online offers (0: none online)."""

    key: str
    kind: str
    label: str
    offers: list[SlotOffer] = field(default_factory=list)
    limit: int = 0
    limit_from: str | None = None
    used: int = 0
    holders: list[str] = field(default_factory=list)
    placeable: bool = False  # some online, non-draining provider offers it: a run can start here

    def shared_by(self) -> list[str]:
        return [o.provider for o in self.offers]


@dataclass
class SlotState:
    """All slots, which (provider, device) names map to which slot, and the providers."""

    slots: dict[str, Slot]
    index: dict[tuple[str, str], str]
    providers: dict[str, ProviderInfo]
    warnings: list[str] = field(default_factory=list)
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)  # run id -> slot keys it holds
    free_keys: set[str] = field(default_factory=set)  # placeable slots with a free unit (kept by hold/release)
    pairs_of: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # slot key -> (provider, device)s

    def slot_for(self, provider: str, device: str) -> Slot | None:
        key = self.index.get((provider, device))
        return self.slots.get(key) if key is not None else None

    def hold(self, run_id: str, provider: str, devices: Sequence[str]) -> None:
        """Count a started or assigned run on its slots (the dispatcher keeps one state up to date
        between provider changes instead of rebuilding it for every pass)."""
        if run_id in self.held:
            return
        keys = tuple(k for d in devices if (k := self.index.get((provider, d))) is not None)
        for key in keys:
            slot = self.slots[key]
            slot.used += 1
            slot.holders.append(run_id)
            self._update_free(slot)
        self.held[run_id] = keys

    def release(self, run_id: str) -> None:
        for key in self.held.pop(run_id, ()):
            slot = self.slots[key]
            slot.used -= 1
            slot.holders.remove(run_id)
            self._update_free(slot)

    def _update_free(self, slot: Slot) -> None:
        if slot.placeable and slot.used < slot.limit:
            self.free_keys.add(slot.key)
        else:
            self.free_keys.discard(slot.key)


def slot_key(provider: str, offer: DeviceOffer) -> str:
    """A UUID identifies a physical card across providers; otherwise provider/device does."""
    return f"uuid:{offer.uuid}" if offer.uuid else f"{provider}/{offer.name}"


Holding = tuple[str, Sequence[str]]  # (provider, devices) a started or assigned run holds


def build_state(
    providers: Iterable[ProviderInfo],
    overrides: LimitOverrides | None = None,
    holdings: Mapping[str, Holding] | None = None,
) -> SlotState:
    """Slots from the providers' offers, limits applied, and usage from the runs holding slots.

    ``holdings`` maps run id -> (provider, devices) for every assigned or running run. A holding on a
    device no provider offers any more is ignored (nothing can start there anyway).
    """
    overrides = overrides or LimitOverrides()
    provs = {p.name: p for p in providers}
    local_by_uuid: dict[str, str] = {}
    for p in provs.values():
        if p.is_local:
            for d in p.devices:
                if d.uuid:
                    local_by_uuid[d.uuid] = d.name
    slots: dict[str, Slot] = {}
    index: dict[tuple[str, str], str] = {}
    warnings: list[str] = []
    # Local first, then workers by name: labels name the sidecar's device when it offers the card.
    for p in sorted(provs.values(), key=lambda p: (not p.is_local, p.name)):
        for d in p.devices:
            key = slot_key(p.name, d)
            slot = slots.get(key)
            if slot is None:
                slot = Slot(key=key, kind=d.kind, label=p.where(d.name))
                slots[key] = slot
            slot.offers.append(
                SlotOffer(p.name, d.name, provider_limit(p, d, overrides, local_by_uuid), p.online, p.draining)
            )
            index[(p.name, d.name)] = key
    for slot in slots.values():
        online = [o for o in slot.offers if o.online]
        if online:
            best = min(online, key=lambda o: (o.limit, o.provider != LOCAL, o.provider))
            slot.limit, slot.limit_from = best.limit, best.provider
            for o in online:
                own = (o.provider, o.device) in overrides.workers or (o.provider == LOCAL and o.device in overrides.local)
                if own and o.limit > best.limit:
                    warnings.append(
                        f"the limit {o.limit} for {o.device} on {o.provider} is lowered to {best.limit}: "
                        f"the same physical card is offered by {best.provider} with limit {best.limit}"
                    )
    state = SlotState(slots, index, provs, warnings)
    for slot in slots.values():
        slot.placeable = any(o.online and not o.draining for o in slot.offers)
        state._update_free(slot)
    for pair, key in index.items():
        state.pairs_of.setdefault(key, []).append(pair)
    for run_id, (provider, devices) in (holdings or {}).items():
        state.hold(run_id, provider, devices)
    return state


# --- the queue and the plan -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    """One way to run: a provider and the provider's names of the devices to take (all at once)."""

    provider: str
    devices: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "devices": list(self.devices)}

    @staticmethod
    def from_json(data: Mapping[str, Any]) -> Candidate:
        return Candidate(str(data["provider"]), tuple(str(d) for d in data["devices"]))


@dataclass(frozen=True)
class QueuedRun:
    """A run waiting for slots; the queue passed to :func:`plan` is in submission order."""

    run_id: str
    candidates: tuple[Candidate, ...]

    @functools.cached_property
    def is_device_set(self) -> bool:
        return any(len(c.devices) > 1 for c in self.candidates)


@dataclass(frozen=True)
class Placement:
    run_id: str
    provider: str
    devices: tuple[str, ...]
    slot_keys: tuple[str, ...]


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
        p = _Pass(self._pass.state, None, True)
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


def _usable(prov: ProviderInfo | None) -> bool:
    return prov is not None and prov.online and not prov.draining


CandTable = list[tuple[Candidate, "ProviderInfo | None", tuple["str | None", ...], bool]]
MAX_REASONS = 3  # reasons spelled out in a waiting_reason; the rest are counted


def _cand_table(cands: Sequence[Candidate], state: SlotState) -> CandTable:
    """Each candidate with its provider, its devices' slot keys (None: no longer offered), and whether
    a run could ever start through it now (provider online, not draining, every device offered)."""
    index, providers = state.index, state.providers
    out: CandTable = []
    for c in cands:
        prov = providers.get(c.provider)
        keys = tuple(index.get((c.provider, d)) for d in c.devices)
        out.append((c, prov, keys, _usable(prov) and None not in keys))
    return out


class _Pass:
    """The bookkeeping of one planning pass: free units per slot, reservations, the result.
    ``examine`` applies the rule to one run."""

    def __init__(self, state: SlotState, admit: AdmitFn | None, explain: bool) -> None:
        self.state = state
        self.admit = admit
        self.explain = explain
        # Free units of every placeable slot that has some; other slots have none.
        self.free: dict[str, int] = {k: state.slots[k].limit - state.slots[k].used for k in state.free_keys}
        self.free_set: set[str] = set(self.free)  # keys with a free unit left in this pass
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
            table = _cand_table(run.candidates, self.state)
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
                chosen = Placement(run.run_id, cand.provider, cand.devices, keys)  # type: ignore[arg-type]
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
                for dev, key in zip(entry[0].devices, entry[2], strict=True):
                    if key in free_set:
                        self._take(key)  # type: ignore[arg-type]
                        self.result.reserved.setdefault(key, run.run_id)  # type: ignore[arg-type]
                        held.append(dev)
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
        return _waiting_text(reasons, list(held), extra)

    def _why(self, cand: Candidate, prov: ProviderInfo | None, keys: tuple[str | None, ...],
             run_id: str = "") -> str | None:
        if prov is None or not prov.online or prov.draining:
            return _provider_reason(cand.provider, prov)
        for dev, key in zip(cand.devices, keys, strict=True):
            if key is None:
                return f"{prov.label} no longer offers {dev}"
        reserved = self.result.reserved
        busy = [_busy_reason(self.state, prov, dev, key, reserved)
                for dev, key in zip(cand.devices, keys, strict=True)
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
    p = _Pass(state, admit, explain)
    total_free = p.total_free()
    i = 0
    for run in queue:
        if total_free <= 0 and stop_when_full:
            break
        i += 1
        total_free -= p.examine(run)
    p.result.examined = i
    return p.result


class _Group:
    """Queued runs with identical candidates, in submission order (they wait for the same slots)."""

    __slots__ = ("gid", "cands", "members", "alive", "pairs", "keys_for", "keys", "table")

    def __init__(self, gid: int, cands: tuple[Candidate, ...]) -> None:
        self.gid = gid
        self.cands = cands
        self.members: list[int] = []  # seqs, ascending; removed runs are skipped (and trimmed)
        self.alive = 0
        self.pairs = tuple(dict.fromkeys((c.provider, d) for c in cands for d in c.devices))
        self.keys_for: int | None = None  # id of the SlotState ``keys``/``table`` were computed for
        self.keys: frozenset[str] = frozenset()
        self.table: CandTable = []

    def resolve(self, state: SlotState) -> None:
        """Cache the slots it could take through providers that can start runs, per state object
        (the dispatcher rebuilds the state, never edits its providers, when they change)."""
        if self.keys_for != id(state):
            index, providers = state.index, state.providers
            self.keys = frozenset(k for pair in self.pairs
                                  if (k := index.get(pair)) is not None and _usable(providers.get(pair[0])))
            self.table = _cand_table(self.cands, state)
            self.keys_for = id(state)


class SlotQueue:
    """The queue in submission order, grouped by candidates and indexed by (provider, device), so a
    pass only looks at runs that could take a slot with a free unit. Runs with the same candidates
    (every "any CUDA card" run, every run for gpu-box's cuda:1) form one group; within a group only
    the earliest runs are looked at, because the later ones want exactly the same slots.

    :meth:`plan` gives the same placements and reservations as :func:`plan` over the runs in order
    (the tests check this on random worlds); ``waiting`` explains the runs it looked at.
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

    def remove(self, run_id: str) -> QueuedRun | None:
        seq = self._by_id.pop(run_id, None)
        if seq is None:
            return None
        run = self._by_seq.pop(seq)
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

    def plan(self, state: SlotState, admit: AdmitFn | None = None, explain: bool = True) -> Plan:
        p = _Pass(state, admit, explain)
        alive = self._by_seq
        providers = state.providers
        # Groups that want a slot with a free unit, through a provider that can start runs.
        wanted: set[int] = set()
        for key in state.free_keys:
            for pair in state.pairs_of.get(key, ()):
                groups = self._by_pair.get(pair)
                if groups and _usable(providers.get(pair[0])):
                    wanted |= groups
        groups = self._group_ids
        # remove() trims dead runs off the front of a group: members[0] is its earliest queued run.
        heap = [(g.members[0], 0, g) for g in map(groups.__getitem__, wanted)]
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
        p.result.examined = examined
        return p.result


def _next_alive(members: list[int], start: int, alive: Mapping[int, Any]) -> int | None:
    for i in range(start, len(members)):
        if members[i] in alive:
            return i
    return None


def _provider_reason(name: str, prov: ProviderInfo | None) -> str:
    if prov is None:
        return f"worker {name} is not connected; the run waits for it"
    if not prov.online:
        return f"{prov.label} is disconnected; the run waits for it to reconnect"
    return f"{prov.label} is draining"


def _busy_reason(state: SlotState, prov: ProviderInfo, dev: str, key: str, reserved: Mapping[str, str]) -> str:
    slot = state.slots[key]
    where = prov.where(dev)
    if key in reserved:
        return f"{where} is reserved for device-set run {short_id(reserved[key])} ahead in the queue"
    if slot.limit <= 0:
        return f"{where} has no online provider"
    plural = "slot" if slot.limit == 1 else "slots"
    others = [state.providers[o].label if o in state.providers else o for o in slot.shared_by() if o != prov.name]
    shared = f", the same card as on {', '.join(others)}" if others else ""
    return f"{where} is busy ({max(slot.limit, slot.used)} of {slot.limit} {plural} used{shared})"


def _waiting_text(reasons: list[str], held: list[str], extra: int = 0) -> str:
    shown = "; ".join(reasons) + (f"; and {extra} other candidate{'s' if extra != 1 else ''}" if extra else "")
    if held:
        return f"holding {', '.join(held)} for this device-set run; waiting for a free slot: {shown}"
    return f"waiting for a free slot: {shown}" if shown else "waiting for a free slot"


def explain_wait(run: QueuedRun, state: SlotState) -> str:
    """Why ``run`` waits in ``state`` (looks at the run's own slots only: cheap)."""
    return Plan(_pass=_Pass(state, None, True)).explain(run)


# --- target resolution (SPEC Q3) ------------------------------------------------------------------------


class TargetError(ValueError):
    """A target or device the server rejects with 400; the message is the answer's ``error``."""


@dataclass(frozen=True)
class RunTarget:
    """A validated ``options.target`` (+ ``options.device``).

    ``worker``: ``"local"``, ``"any"`` or a worker name; ``devices``: a device set (strict: every device
    must be offered); ``device``: one device without a set (``auto``, a kind, or a card; a local run
    falls back when the machine lacks it); ``pool``: a one-shot worker pool.
    """

    worker: str = LOCAL
    devices: tuple[str, ...] | None = None
    device: str | None = None
    pool: str | None = None
    memory_gib: float | None = None
    memory_source: str | None = None
    wait: bool | None = None


MEMORY_SOURCES = ("user", "estimate", "measured")


def parse_target(options: Mapping[str, Any]) -> RunTarget:
    """Validate ``options.target`` and ``options.device``; raise TargetError naming the field.

    ``target`` may be a string (``"local"``, ``"any"``, a worker name) or an object
    ``{"worker", "devices", "memory_gib", "memory_source", "wait", "pool"}``.
    """
    raw = options.get("target")
    device_raw = options.get("device")
    if raw is None:
        raw = {}
    if isinstance(raw, str):
        raw = {"worker": raw}
    if not isinstance(raw, Mapping):
        raise TargetError("options.target must be an object like {\"worker\": \"local\"} or a worker name string")
    known = {"worker", "devices", "memory_gib", "memory_source", "wait", "pool"}
    unknown = sorted(set(raw) - known)
    if unknown:
        raise TargetError(f"options.target has unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    worker = raw.get("worker", LOCAL)
    if worker is None:
        worker = LOCAL
    if not isinstance(worker, str) or not worker.strip():
        raise TargetError("options.target.worker must be \"local\", \"any\" or a worker name")
    worker = worker.strip()
    if worker not in (LOCAL, "any") and not _WORKER_NAME_RE.match(worker):
        raise TargetError(
            f"options.target.worker {worker!r} is not a worker name (letters, digits, '.', '_', '-'; up to 64)"
        )
    pool = raw.get("pool")
    if pool is not None:
        if not isinstance(pool, str) or not _WORKER_NAME_RE.match(pool.strip()):
            raise TargetError("options.target.pool must be a pool name (letters, digits, '.', '_', '-')")
        pool = pool.strip()
        if worker not in (LOCAL, "any"):
            raise TargetError("give options.target.worker or options.target.pool, not both")
    devices: tuple[str, ...] | None = None
    if raw.get("devices") is not None:
        devs = raw["devices"]
        if isinstance(devs, str):
            devs = [d for d in devs.split(",") if d.strip()]
        if not isinstance(devs, list) or not devs:
            raise TargetError("options.target.devices must be a non-empty list of device names like [\"cuda:0\"]")
        if len(devs) > MAX_DEVICE_SET:
            raise TargetError(f"options.target.devices lists {len(devs)} devices; at most {MAX_DEVICE_SET}")
        names: list[str] = []
        for d in devs:
            try:
                names.append(normalize_device(d, allow_kind=False))
            except ValueError as exc:
                raise TargetError(f"options.target.devices: {exc}") from None
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise TargetError(f"options.target.devices lists {', '.join(dupes)} more than once")
        kinds = {device_kind(n) for n in names}
        if len(kinds) > 1:
            raise TargetError(
                f"options.target.devices mixes device kinds ({', '.join(names)}); a set is of one kind"
            )
        devices = tuple(names)
    device: str | None = None
    if device_raw is not None:
        try:
            device = normalize_device(device_raw, allow_kind=True, allow_auto=True)
        except ValueError as exc:
            raise TargetError(f"options.device: {exc}") from None
        if devices is not None:
            if device != devices[0]:
                raise TargetError(
                    "give options.device or options.target.devices, not both "
                    f"(device {device} is not the first device of the set {', '.join(devices)})"
                )
            device = None
    memory_gib = raw.get("memory_gib")
    if memory_gib is not None:
        if isinstance(memory_gib, bool) or not isinstance(memory_gib, int | float) or not memory_gib > 0 \
                or memory_gib != memory_gib or memory_gib > 1e6:
            raise TargetError("options.target.memory_gib must be a positive number of GiB per card, e.g. 6")
        memory_gib = float(memory_gib)
    memory_source = raw.get("memory_source")
    if memory_source is not None and memory_source not in MEMORY_SOURCES:
        raise TargetError(f"options.target.memory_source must be one of {', '.join(MEMORY_SOURCES)}")
    if memory_source is not None and memory_gib is None:
        raise TargetError("options.target.memory_source needs options.target.memory_gib")
    wait = raw.get("wait")
    if wait is not None and not isinstance(wait, bool):
        raise TargetError("options.target.wait must be true or false")
    return RunTarget(worker, devices, device, pool, memory_gib, memory_source, wait)


@dataclass(frozen=True)
class Resolution:
    """Where a run may go: its candidates in preference order, plus what to record."""

    target: str
    candidates: tuple[Candidate, ...]
    requested: tuple[str, ...]
    device_set: bool
    warnings: tuple[dict[str, Any], ...] = ()

    @property
    def queue_key(self) -> str:
        """The queue a run waits in: ``local/cuda:0``, ``gpu-box/cuda:2,cuda:3``, ``any/cuda``."""
        return f"{self.target}/{','.join(self.requested)}"


def _cards_of_kind(p: ProviderInfo, kind: str) -> list[str]:
    return [d.name for d in p.devices if d.kind == kind]


def _auto_choice(p: ProviderInfo) -> list[str]:
    """``auto``: every card of the provider's first accelerator kind, else its CPU."""
    for d in p.devices:
        if d.kind in ACCELERATOR_KINDS:
            return _cards_of_kind(p, d.kind)
    return ["cpu"] if "cpu" in p.device_names() else p.device_names()[:1]


def _single_choices(p: ProviderInfo, device: str) -> list[str]:
    """The provider's devices a one-device request may take (empty: it offers none)."""
    if device == "auto":
        return _auto_choice(p)
    if ":" not in device and device != "cpu":
        return _cards_of_kind(p, device)
    return [device] if device in p.device_names() else []


def _offers(p: ProviderInfo) -> str:
    names = p.device_names()
    return ", ".join(names) if names else "nothing"


def _local_resolution(local: ProviderInfo, t: RunTarget) -> Resolution:
    if t.devices is not None:
        missing = [d for d in t.devices if d not in local.device_names()]
        if missing:
            raise TargetError(f"this server does not offer {', '.join(missing)} (it offers {_offers(local)})")
        return Resolution(LOCAL, (Candidate(LOCAL, t.devices),), t.devices, True)
    device = t.device or "auto"
    choices = _single_choices(local, device)
    warnings: list[dict[str, Any]] = []
    if not choices:
        kind = device_kind(device)
        same_kind = _cards_of_kind(local, kind)
        fallback = same_kind[0] if same_kind else ("cpu" if "cpu" in local.device_names() else _auto_choice(local)[0])
        choices = [fallback]
        warnings.append({
            "kind": "device_fallback",
            "message": (
                f"The run is set to device {device}; this server offers {_offers(local)}, "
                f"so the run runs on {fallback}."
            ),
            "requested": device,
            "device": fallback,
        })
    cands = tuple(Candidate(LOCAL, (c,)) for c in choices)
    return Resolution(LOCAL, cands, (device,), False, tuple(warnings))


def _provider_candidates(p: ProviderInfo, t: RunTarget) -> list[Candidate]:
    if t.devices is not None:
        if all(d in p.device_names() for d in t.devices):
            return [Candidate(p.name, t.devices)]
        return []
    return [Candidate(p.name, (c,)) for c in _single_choices(p, t.device or "auto")]


def _any_may_use_local(t: RunTarget) -> bool:
    """Under ``any``, a CUDA set of more than one card, or one card other than cuda:0, needs a worker:
    only a worker renumbers the run's cards from cuda:0."""
    named = list(t.devices) if t.devices is not None else ([t.device] if t.device else [])
    cuda = [d for d in named if device_kind(d) == "cuda" and ":" in d]
    return not (len(cuda) > 1 or (len(cuda) == 1 and cuda[0] != "cuda:0"))


def resolve_target(
    t: RunTarget,
    providers: Sequence[ProviderInfo],
    pools: Mapping[str, Sequence[str]] | None = None,
) -> Resolution:
    """Candidates for a run (SPEC Q3); raise TargetError (400) with the message to show.

    ``providers``: this server (``is_local``) and every worker that connected since the server started,
    online or not. ``pools``: one-shot worker pools by name -> their workers' names.
    """
    local = next((p for p in providers if p.is_local), None)
    workers = sorted((p for p in providers if not p.is_local), key=lambda p: p.name)
    requested = t.devices if t.devices is not None else (t.device or "auto",)
    wanted = ", ".join(requested)
    if t.pool is not None:
        members = (pools or {}).get(t.pool)
        if members is None:
            raise TargetError(f"unknown pool '{t.pool}': no one-shot worker pool with this name is known")
        member_set = set(members)
        cands = [c for p in workers if p.name in member_set for c in _provider_candidates(p, t)]
        if not cands:
            raise TargetError(f"no worker of pool '{t.pool}' offers {wanted}")
        return Resolution(f"pool:{t.pool}", tuple(cands), requested, t.devices is not None)
    if t.worker == LOCAL:
        if local is None:
            raise TargetError("this server runs no local runs (no local provider)")
        return _local_resolution(local, t)
    if t.worker == "any":
        cands = [c for p in workers for c in _provider_candidates(p, t)]
        local_ok = _any_may_use_local(t)
        if local is not None and local_ok:
            cands += _provider_candidates(local, t)
        if not cands:
            seen = ", ".join(p.name for p in workers) or "none"
            why = "" if local_ok else (
                "; a CUDA set of more than one card, or one card other than cuda:0, runs on workers only"
            )
            server = " and this server does not either" if local_ok and local is not None else ""
            raise TargetError(
                f"no worker seen since the server started offers {wanted}{server} (workers: {seen}){why}"
            )
        return Resolution("any", tuple(cands), requested, t.devices is not None)
    worker = next((p for p in workers if p.name == t.worker), None)
    if worker is None:
        raise TargetError(f"unknown worker '{t.worker}': no worker with this name has connected since the server started")
    cands = _provider_candidates(worker, t)
    if not cands:
        missing = [d for d in requested if not _single_choices(worker, d)]
        raise TargetError(f"worker '{worker.name}' does not offer {', '.join(missing or requested)} "
                          f"(it offers {_offers(worker)})")
    return Resolution(worker.name, tuple(cands), requested, t.devices is not None)
