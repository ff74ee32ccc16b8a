"""Why a run waits: the waiting_reason texts of the slot rule."""

from __future__ import annotations

from collections.abc import Mapping

from .offers import ProviderInfo, short_id
from .state import SlotState


def provider_reason(name: str, prov: ProviderInfo | None) -> str:
    if prov is None:
        return f"worker {name} is not connected; the run waits for it"
    if prov.disabled:
        return f"{prov.label} {prov.note or 'is disabled'}"
    if not prov.online:
        return f"{prov.label} is disconnected; the run waits for it to reconnect"
    if prov.note:
        return f"{prov.label} {prov.note}"
    return f"{prov.label} is draining"


def busy_reason(state: SlotState, prov: ProviderInfo, dev: str, key: str, reserved: Mapping[str, str]) -> str:
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


def waiting_text(reasons: list[str], held: list[str], extra: int = 0) -> str:
    shown = "; ".join(reasons) + (f"; and {extra} other candidate{'s' if extra != 1 else ''}" if extra else "")
    if held:
        return f"holding {', '.join(held)} for this device-set run; waiting for a free slot: {shown}"
    return f"waiting for a free slot: {shown}" if shown else "waiting for a free slot"
