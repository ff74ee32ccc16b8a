"""Slot state (docs/sidecar.md): one slot per physical device, its limit, and the runs holding it."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ...constants import LOCAL_PROVIDER
from .limits import LimitOverrides, provider_limit
from .offers import DeviceOffer, ProviderInfo

LOCAL = LOCAL_PROVIDER

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

    def hold(self, run_id: str, provider: str, devices: Sequence[str],
             extra: Sequence[tuple[str, Sequence[str]]] = ()) -> None:
        """Count a started or assigned run on its slots (the dispatcher keeps one state up to date
        between provider changes instead of rebuilding it for every pass); ``extra``: the other
        workers' parts of a spread run, held under the same run id."""
        if run_id in self.held:
            return
        parts = ((provider, devices), *extra)
        keys = tuple(k for p, devs in parts for d in devs if (k := self.index.get((p, d))) is not None)
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


# (provider, devices) a started or assigned run holds, plus a spread run's other parts (SlotState.hold)
Holding = tuple[str, Sequence[str]] | tuple[str, Sequence[str], Sequence[tuple[str, Sequence[str]]]]


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
    for run_id, holding in (holdings or {}).items():
        state.hold(run_id, *holding)
    return state


