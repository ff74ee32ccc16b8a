"""Which unit takes a request (docs/services.md): pure.

Units are symmetric, so the choice is only about load: the ready unit with the fewest outstanding
requests; among equals the one that was sent the fewest so far (so an idle service alternates), then
the lowest index. A request never goes to a unit that is not ready.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class RouteView:
    """What routing knows about one unit."""

    unit_id: str
    ready: bool
    outstanding: int = 0
    routed: int = 0
    index: int = 0
    state: str = "ready"
    detail: str = ""  # why it is not ready (for the 503 text)


def choose_unit(units: Sequence[RouteView]) -> str | None:
    """The unit for the next request, or None when no unit is ready."""
    ready = [u for u in units if u.ready]
    if not ready:
        return None
    return min(ready, key=lambda u: (u.outstanding, u.routed, u.index)).unit_id


def no_unit_reason(service: str, units: Sequence[RouteView], waited_s: float) -> str:
    """The 503 text: no unit became ready in time, and what each unit is doing."""
    if not units:
        return f"service {service} has no unit (it is being deleted, or every unit was retired)"
    parts = []
    for u in sorted(units, key=lambda u: u.index):
        parts.append(f"unit {u.unit_id} is {u.state}" + (f" ({u.detail})" if u.detail else ""))
    return f"service {service} has no ready unit after waiting {waited_s:g} s: " + "; ".join(parts)
