"""The rolling update plan (docs/services.md): whole units, make-before-break, one at a time, rollback.

A small simulator executes the planner's steps: a started unit becomes ready one tick later (or never,
for a broken version), a retired unit drains for one tick and is gone. The invariants are checked at
every tick: never fewer ready units than replicas (no request lacks a unit), at most one extra unit
(surge 1), at most one unit retiring, and at the end every unit runs the target version.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest

from xpufleet.server.units.rollout import DONE, WAIT, UnitView, next_step

TIMEOUT = 5.0


@dataclass
class Sim:
    units: list[UnitView]
    broken: frozenset[int] = frozenset()  # versions whose units never become ready
    failing: frozenset[int] = frozenset()  # versions whose units fail (restart budget)
    now: float = 0.0
    serial: int = 100

    def tick(self) -> None:
        self.now += 1.0
        out = []
        for u in self.units:
            if u.state == "draining":
                continue  # retired: gone
            if u.state == "starting" and u.version not in self.broken:
                u = UnitView(u.unit_id, u.version, "failed" if u.version in self.failing else "ready", u.index, self.now)
            out.append(u)
        self.units = out

    def apply(self, step, target: int) -> None:
        if step.action == "start":
            self.serial += 1
            self.units.append(UnitView(f"u{self.serial}", target, "starting", self.serial, self.now))
        elif step.action in ("retire", "abort"):
            self.units = [UnitView(u.unit_id, u.version, "draining", u.index, self.now) if u.unit_id == step.unit_id
                          else u for u in self.units]


def run_update(sim: Sim, target: int, replicas: int, limit: int = 200):
    """Drive the planner to the end; the steps taken and, for a rollback, the reason."""
    steps = []
    # No request lacks a unit: the ready units never drop below what there was (at most replicas).
    floor = min(replicas, sum(1 for u in sim.units if u.state == "ready"))
    ceiling = max(replicas, len(sim.units)) + 1  # surge: at most one unit more
    for _ in range(limit):
        step = next_step(sim.units, target, replicas, sim.now, TIMEOUT)
        steps.append(step.action)
        if step == DONE:
            return steps, None
        if step.action == "abort":
            sim.apply(step, target)
            return steps, step.reason
        sim.apply(step, target)
        live = [u for u in sim.units if u.state != "draining"]
        assert len([u for u in sim.units if u.state == "draining"]) <= 1
        assert len(live) <= ceiling
        sim.tick()
        assert sum(1 for u in sim.units if u.state == "ready") >= floor
    raise AssertionError(f"no end after {limit} steps: {steps}")


def ready_units(n: int, version: int = 1) -> list[UnitView]:
    return [UnitView(f"o{i}", version, "ready", i, 0.0) for i in range(n)]


@pytest.mark.parametrize("replicas", [1, 2, 3, 5])
def test_every_unit_is_replaced_one_at_a_time(replicas):
    sim = Sim(ready_units(replicas))
    steps, reason = run_update(sim, 2, replicas)
    assert reason is None
    assert sorted(u.version for u in sim.units) == [2] * replicas and all(u.state == "ready" for u in sim.units)
    assert steps.count("start") == replicas and steps.count("retire") == replicas
    # make-before-break: every retirement follows the start of its replacement
    starts = retires = 0
    for action in steps:
        starts += action == "start"
        retires += action == "retire"
        assert retires <= starts


def test_a_new_unit_that_never_becomes_ready_aborts_the_update():
    sim = Sim(ready_units(2), broken=frozenset({2}))
    steps, reason = run_update(sim, 2, 2)
    assert steps[-1] == "abort" and "did not become ready within 5 s" in reason
    assert [u.version for u in sim.units if u.state == "ready"] == [1, 1]  # the old units never left


def test_a_new_unit_that_fails_aborts_at_once():
    sim = Sim(ready_units(1), failing=frozenset({2}))
    steps, reason = run_update(sim, 2, 1)
    assert steps[-1] == "abort" and "failed" in reason


def test_rollback_replaces_the_new_units_back():
    """Version 2 works for the first unit; then the update is rolled back (version 1 is the target again)."""
    sim = Sim(ready_units(3))
    for _ in range(3):  # a part of the update happens: one new unit takes over
        sim.apply(next_step(sim.units, 2, 3, sim.now, TIMEOUT), 2)
        sim.tick()
    assert 2 in {u.version for u in sim.units} and 1 in {u.version for u in sim.units}
    steps, reason = run_update(sim, 1, 3)
    assert reason is None and sorted(u.version for u in sim.units) == [1, 1, 1]


def test_failed_old_units_go_first():
    units = [UnitView("o0", 1, "ready", 0, 0.0), UnitView("o1", 1, "failed", 1, 0.0)]
    sim = Sim(units)
    first = next_step(sim.units, 2, 2, 0.0, TIMEOUT)
    assert first.action == "start"
    sim.apply(first, 2)
    sim.tick()
    assert next_step(sim.units, 2, 2, sim.now, TIMEOUT).unit_id == "o1"


@pytest.mark.parametrize(("before", "after"), [(1, 3), (3, 1), (2, 2), (0, 2)])
def test_replicas_change_with_the_update(before, after):
    sim = Sim(ready_units(before))
    steps, reason = run_update(sim, 2, after)
    assert reason is None and sorted(u.version for u in sim.units) == [2] * after


def test_waits_while_a_unit_drains_or_starts():
    draining = [UnitView("o0", 1, "draining", 0, 0.0), UnitView("n1", 2, "ready", 1, 0.0)]
    assert next_step(draining, 2, 1, 0.0, TIMEOUT) == WAIT
    starting = [UnitView("o0", 1, "ready", 0, 0.0), UnitView("n1", 2, "placing", 1, 0.0)]
    assert next_step(starting, 2, 1, 1.0, TIMEOUT) == WAIT
    assert next_step(starting, 2, 1, 5.0, TIMEOUT).action == "abort"


def test_every_small_world_ends():
    """From any mix of old/new ready units the planner reaches all-new without breaking the invariants."""
    for old, new, replicas in itertools.product(range(4), range(4), range(1, 4)):
        units = ready_units(old) + [UnitView(f"n{i}", 2, "ready", 10 + i, 0.0) for i in range(new)]
        sim = Sim(units)
        _, reason = run_update(sim, 2, replicas)
        assert reason is None and sorted(u.version for u in sim.units) == [2] * replicas
