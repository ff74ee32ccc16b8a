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
import itertools
import re
from bisect import bisect_left, bisect_right
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

_STATE_SERIALS = itertools.count(1)
_LOG_KEEP = 4096  # hold/release changes a SlotState remembers for SlotQueue (it starts over past that)


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
    # One provider naming one physical card twice (two device names, one UUID): a candidate may then
    # list one slot twice; SlotQueue plans such a state with full passes only.
    repeated_keys: bool = False
    # Identity of this state object for caches (``id()`` values are reused after garbage collection).
    serial: int = field(default_factory=lambda: next(_STATE_SERIALS))
    # Change log of hold/release: ``version`` counts changes; ``_log`` holds the slot keys of the most
    # recent ones, the first of them being change number ``_log_base``. SlotQueue reads it to see which
    # slots changed since its last pass.
    version: int = 0
    _log: list[str] = field(default_factory=list, repr=False)
    _log_base: int = 0

    def changes_since(self, version: int) -> list[str] | None:
        """Slot keys whose usage changed after change number ``version``; None when the log no longer
        reaches back that far (the reader then starts over)."""
        if version < self._log_base or version > self.version:
            return None
        return self._log[version - self._log_base:]

    def _changed(self, key: str) -> None:
        self._log.append(key)
        self.version += 1
        if len(self._log) > _LOG_KEEP:
            drop = len(self._log) // 2
            del self._log[:drop]
            self._log_base += drop

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
            self._changed(key)
        self.held[run_id] = keys

    def release(self, run_id: str) -> None:
        for key in self.held.pop(run_id, ()):
            slot = self.slots[key]
            slot.used -= 1
            slot.holders.remove(run_id)
            self._update_free(slot)
            self._changed(key)

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
    state.repeated_keys = any(len({prov for prov, _ in pairs}) < len(pairs) for pairs in state.pairs_of.values())
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
                taken: list[str] = []
                for dev, key in zip(entry[0].devices, entry[2], strict=True):
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

    __slots__ = ("gid", "cands", "members", "alive", "pairs", "keys_for", "keys", "table", "pos_of")

    def __init__(self, gid: int, cands: tuple[Candidate, ...]) -> None:
        self.gid = gid
        self.cands = cands
        self.members: list[int] = []  # seqs, ascending; removed runs are skipped (and trimmed)
        self.alive = 0
        self.pairs = tuple(dict.fromkeys((c.provider, d) for c in cands for d in c.devices))
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
                                  if (k := index.get(pair)) is not None and _usable(providers.get(pair[0])))
            self.table = _cand_table(self.cands, state)
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
        p = _Pass(state, admit, explain, free=dict(self._spare))
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
            if not gids or not _usable(providers.get(pair[0])):
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
            placements.append(Placement(run.run_id, cand.provider, cand.devices, new))
            placed[seq] = new
        else:
            held_devices: list[str] = []
            if run.is_device_set:  # it holds what is free of its first candidate that could start
                entry = next((e for e in table if e[3]), None)
                if entry is not None:
                    new = tuple(k for k in entry[2] if free_at(k) > 0)  # type: ignore[arg-type]
                    held_devices = [d for d, k in zip(entry[0].devices, entry[2], strict=True) if k in new]
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

    def _plan_new(self, p: _Pass, state: SlotState) -> int:
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

    def _heap_pass(self, p: _Pass, state: SlotState, after: int) -> int:
        """The pass over runs with seq > ``after``: groups that want a free slot, merged by their
        earliest queued run, each dropped once every slot it could use is taken."""
        alive = self._by_seq
        providers = state.providers
        # Groups that want a slot with a free unit, through a provider that can start runs.
        wanted: set[int] = set()
        for key in p.free_set:
            for pair in state.pairs_of.get(key, ()):
                groups = self._by_pair.get(pair)
                if groups and _usable(providers.get(pair[0])):
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

    def _record(self, p: _Pass, known: int, state: SlotState, reusable: bool) -> None:
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
