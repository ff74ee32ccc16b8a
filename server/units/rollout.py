"""The rolling update (docs/services.md "Ardışık güncellemeler"): a pure planner of the next step.

A unit is replaced whole, make-before-break, one unit at a time: a new unit (the new spec version)
starts all its instances in parallel; once it is ready, traffic moves off one old unit, which finishes
its in-flight requests and is then deleted; then the next. A new unit that does not become ready
within ``ready_timeout_s`` (or fails its restart budget) stops the update: it is ended and the update
rolls back (the manager plans again with the old version as the target, so units already replaced are
replaced back the same way).

:func:`next_step` looks only at the units as they are now, so the same call resumes an update after a
sidecar restart. The manager executes one step, waits for a change, and asks again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from .lifecycle import ENDING

STARTING_STATES = frozenset({"placing", "starting", "recovering", "restarting"})


@dataclass(frozen=True)
class UnitView:
    """One unit as the planner sees it."""

    unit_id: str
    version: int
    state: str
    index: int
    since: float  # when it was created (new units) or entered its state
    reason: str = ""  # why it is not ready yet (for a rollback's report)


@dataclass(frozen=True)
class Step:
    """``start`` a unit of the target version; ``retire`` (drain then delete) ``unit_id``; ``abort``
    the new unit ``unit_id`` and roll back; ``wait`` for a change; ``done``."""

    action: str
    unit_id: str | None = None
    reason: str = ""


WAIT = Step("wait")
DONE = Step("done")


def next_step(units: Sequence[UnitView], target: int, replicas: int, now: float, ready_timeout_s: float) -> Step:
    """The next step of an update to spec version ``target`` with ``replicas`` units."""
    live = [u for u in units if u.state not in ENDING]
    if any(u.state in ENDING for u in units):
        return WAIT  # one unit at a time: the previous retirement finishes first
    new = [u for u in live if u.version == target]
    old = [u for u in live if u.version != target]
    for u in new:
        if u.state == "failed":
            return Step("abort", u.unit_id, f"new unit {u.unit_id} failed: {u.reason or 'restart budget spent'}")
        if u.state in STARTING_STATES:
            if now - u.since >= ready_timeout_s:
                why = f": {u.reason}" if u.reason else ""
                return Step("abort", u.unit_id,
                            f"new unit {u.unit_id} did not become ready within {ready_timeout_s:g} s{why}")
            return WAIT
    if old:
        if len(new) + len(old) > replicas:
            # Failed old units go first, then the oldest.
            victim = min(old, key=lambda u: (u.state != "failed", u.index))
            return Step("retire", victim.unit_id)
        return Step("start")  # the surge unit
    if len(new) < replicas:
        return Step("start")
    if len(new) > replicas:
        return Step("retire", max(new, key=lambda u: u.index).unit_id)
    return DONE
