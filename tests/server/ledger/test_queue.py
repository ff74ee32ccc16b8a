"""The queue of runs waiting for memory: the rule in submission order, and the incremental queue giving
exactly the reference's placements on random worlds."""

from __future__ import annotations

import random

import pytest

from xpufleet.server.ledger.fit import Ledger
from xpufleet.server.ledger.queue import (
    INF,
    MemoryHolds,
    MemoryPlacement,
    MemoryQueue,
    MemoryRun,
    _MinTree,
    plan_reference,
)


def ledger_with(*cards: tuple[str, float, float]) -> Ledger:
    ledger = Ledger()
    for key, total, free in cards:
        ledger.set_card(key, f"{key} on box", "cuda", total_gib=total, free_gib=free)
    return ledger


def test_runs_start_in_submission_order_on_their_first_fitting_candidate():
    ledger = ledger_with(("a", 24, 24), ("b", 24, 24))
    runs = [MemoryRun("r1", 10, (("a",),)), MemoryRun("r2", 10, (("a",), ("b",))), MemoryRun("r3", 10, (("a",),)),
            MemoryRun("r4", 5, (("b",),))]
    # a: r1 (10.75) + r2 would be 21.5 <= 24, so r2 takes a; r3 does not fit a; r4 takes b
    assert plan_reference(runs, ledger) == [MemoryPlacement("r1", 0, ("a",)), MemoryPlacement("r2", 0, ("a",)),
                                            MemoryPlacement("r4", 0, ("b",))]


def test_a_smaller_later_run_may_start_before_a_larger_earlier_one():
    """No memory is held for a waiting run (the module's documented choice)."""
    ledger = ledger_with(("a", 24, 24))
    ledger.hold_running("big-running", ["a"], 12)
    q = MemoryQueue(ledger)
    q.add(MemoryRun("large", 16, (("a",),)))
    q.add(MemoryRun("small", 4, (("a",),)))
    assert [p.run_id for p in q.plan()] == ["small"]
    assert "large" in q and "small" not in q
    ledger.start("small")
    ledger.release("big-running")
    ledger.report("a", 24, 24 - 4.75)
    assert [p.run_id for p in q.plan()] == ["large"]


def test_placed_runs_are_reserved_on_the_ledger_and_leave_the_queue():
    ledger = ledger_with(("a", 24, 24))
    q = MemoryQueue(ledger)
    q.add(MemoryRun("r1", 6, (("a",),)))
    assert q.plan() == [MemoryPlacement("r1", 0, ("a",))]
    assert ledger.runs["r1"].started is False and "r1" in ledger.cards["a"].reserved
    assert len(q) == 0 and q.plan() == []
    with pytest.raises(ValueError, match="queued already"):
        q.add(MemoryRun("r2", 1, (("a",),)))
        q.add(MemoryRun("r2", 1, (("a",),)))


def test_a_raised_budget_keeps_the_runs_place():
    ledger = ledger_with(("a", 24, 24))
    ledger.hold_running("x", ["a"], 20)
    q = MemoryQueue(ledger)
    q.add(MemoryRun("first", None, (("a",),)))  # queued while the card was exclusive: no budget yet
    q.add(MemoryRun("second", 3, (("a",),)))
    assert q.plan() == []
    q.set_budget("first", 2.0)  # the graph's default budget arrives
    ledger.release("x")
    assert [p.run_id for p in q.plan()] == ["first", "second"]


def test_a_card_that_reports_later_is_planned_then():
    ledger = Ledger()
    ledger.set_card("a", "cuda:0 on box", "cuda")
    q = MemoryQueue(ledger)
    q.add(MemoryRun("r1", 6, (("a",),)))
    assert q.plan() == []
    ledger.report("a", 24, 24)
    assert [p.run_id for p in q.plan()] == ["r1"]


def test_min_tree_finds_the_first_value_at_most_the_limit():
    values = [5.0, 9.0, 3.0, INF, 7.0, 1.0, 8.0]
    tree = _MinTree()
    for v in values:
        tree.append(v)
    for limit in (0.5, 1.0, 3.0, 6.0, 100.0):
        for start in range(len(values) + 1):
            want = next((i for i in range(start, len(values)) if values[i] <= limit), None)
            assert tree.first_at_most(limit, start) == want, (limit, start)
    tree.set(5, INF)
    assert tree.first_at_most(2.0, 0) is None


def _world(seed: int, steps: int = 150) -> None:
    rng = random.Random(seed)
    cards = [(f"w{w}/cuda:{i}", rng.choice([8, 16, 24])) for w in range(3) for i in range(3)]
    fast, ref_ledger = Ledger(), Ledger()
    for key, total in cards:
        for ledger in (fast, ref_ledger):
            ledger.set_card(key, key, "cuda", total_gib=total, free_gib=total)
    q, ref = MemoryQueue(fast), []
    ref_holds = MemoryHolds()
    running: list[str] = []
    n = 0
    for step in range(steps):
        for _ in range(rng.randint(0, 4)):
            n += 1
            r = rng.random()
            budget = rng.choice([1, 2, 3.5, 6, 10, 20, None, 4])
            if r < 0.5:
                cands = ((rng.choice(cards)[0],),)
            elif r < 0.8:
                cands = tuple((k,) for k, _ in rng.sample(cards, rng.randint(2, len(cards))))
            else:
                w = rng.randrange(3)
                cands = ((f"w{w}/cuda:0", f"w{w}/cuda:1"),)
            run = MemoryRun(f"r{n}", budget, cands)
            q.add(run)
            ref.append(run)
        event = rng.random()
        if event < 0.4 and running:
            gone = running.pop(rng.randrange(len(running)))
            fast.release(gone)
            ref_ledger.release(gone)
        elif event < 0.55:
            key, total = rng.choice(cards)
            free = rng.uniform(0, total)
            fast.report(key, total, free)
            ref_ledger.report(key, total, free)
        elif event < 0.6:
            key, _ = rng.choice(cards)
            shared = rng.random() < 0.8
            fast.set_shared(key, shared)
            ref_ledger.set_shared(key, shared)
        elif event < 0.65 and len(q):
            gone = rng.choice(q.runs()).run_id
            q.remove(gone)
            ref[:] = [r for r in ref if r.run_id != gone]
        elif event < 0.7 and len(q):
            run = rng.choice(q.runs())
            budget = (run.budget_gib or 1) + rng.choice([0, 1, 5])
            q.set_budget(run.run_id, budget)
            ref[:] = [MemoryRun(r.run_id, budget, r.candidates) if r.run_id == run.run_id else r for r in ref]
        got, want = q.plan(), plan_reference(ref, ref_ledger, ref_holds)
        assert got == want, (seed, step)
        assert q.holds.by_key == ref_holds.by_key, (seed, step)
        assert q.holds.overtaken == ref_holds.overtaken, (seed, step)
        placed = {p.run_id for p in want}
        ref[:] = [r for r in ref if r.run_id not in placed]
        assert [r.run_id for r in q.runs()] == [r.run_id for r in ref]
        for p in got:
            if rng.random() < 0.7:
                fast.start(p.run_id)
                ref_ledger.start(p.run_id)
            running.append(p.run_id)


@pytest.mark.parametrize("seed", range(40))
def test_incremental_queue_places_exactly_what_the_reference_places(seed):
    _world(seed)


def test_removed_runs_are_compacted_away_without_changing_the_order():
    ledger = ledger_with(("a", 80, 0))
    q = MemoryQueue(ledger)
    for i in range(300):
        q.add(MemoryRun(f"r{i:03d}", 1 + i % 5, (("a",),)))
    assert q.plan() == []
    for i in range(0, 300, 3):
        q.remove(f"r{i:03d}")
    for i in range(1, 200, 3):
        q.remove(f"r{i:03d}")
    assert q._cards["a"].dead < 64  # compacted
    left = [r.run_id for r in q.runs()]
    ledger.report("a", 80, 80)
    placed = [p.run_id for p in q.plan()]
    assert placed == [r for r in left if r in placed] and placed[0] == left[0]
    ref = ledger_with(("a", 80, 80))
    assert placed == [p.run_id for p in plan_reference([MemoryRun(r, 1 + int(r[1:]) % 5, (("a",),)) for r in left], ref)]


def test_a_run_overtaken_three_times_holds_the_card_until_it_starts():
    """The anti-starvation hold: small runs may pass a large waiting one, but only so often."""
    ledger = ledger_with(("a", 24, 24))
    ledger.hold_running("x", ["a"], 12)  # 12.75 GiB counted: 11.25 GiB of room
    q = MemoryQueue(ledger)
    q.add(MemoryRun("large", 16, (("a",),)))
    started: list[str] = []
    for i in range(3):  # each small run overtakes "large", then ends
        q.add(MemoryRun(f"small{i}", 4, (("a",),)))
        placed = [p.run_id for p in q.plan()]
        assert placed == [f"small{i}"]
        started += placed
        ledger.start(f"small{i}")
        ledger.release(f"small{i}")
    assert q.holds.holder("a") == "large" and q.holds.overtaken[("large", "a")] == 3
    q.add(MemoryRun("small3", 4, (("a",),)))
    assert q.plan() == []  # room for small3, but the card is held for the earlier run
    ledger.release("x")  # the run ahead ends: the large run starts, then the hold ends
    assert [p.run_id for p in q.plan()] == ["large"]
    assert q.holds.holder("a") is None
    assert [p.run_id for p in q.plan()] == ["small3"]  # 16.75 + 4.75 <= 24


def test_a_hold_ends_when_the_holder_leaves_or_cannot_fit_the_card():
    ledger = ledger_with(("a", 24, 24), ("b", 48, 48))
    ledger.hold_running("x", ["a"], 18)  # 5.25 GiB of room: three 1 GiB runs (1.75 each) fit
    holds = MemoryHolds(limit=1)
    q = MemoryQueue(ledger, holds)
    q.add(MemoryRun("large", 10, (("a",), ("b",))))
    ledger.hold_running("y", ["b"], 40)
    q.add(MemoryRun("small", 1, (("a",),)))
    assert [p.run_id for p in q.plan()] == ["small"]
    assert holds.holder("a") == "large"
    q.set_budget("large", 30)  # raised beyond card a's 24 GiB: it can no longer hold a
    q.add(MemoryRun("small2", 1, (("a",),)))
    assert [p.run_id for p in q.plan()] == ["small2"] and holds.holder("a") is None
    q.set_budget("large", 10)
    q.add(MemoryRun("small3", 1, (("a",),)))
    assert [p.run_id for p in q.plan()] == ["small3"] and holds.holder("a") == "large"
    q.remove("large")  # cancelled: its hold ends at once
    assert holds.by_key == {} and "a" in ledger.grown


def test_the_reference_rule_respects_holds_the_same_way():
    ledger = ledger_with(("a", 24, 24))
    holds = MemoryHolds(by_key={"a": "r1"})
    runs = [MemoryRun("r1", 30, (("a",),)), MemoryRun("r2", 1, (("a",),))]
    assert plan_reference(runs, ledger, holds) == [MemoryPlacement("r2", 0, ("a",))]  # r1 cannot hold a 24 GiB card
    holds = MemoryHolds(by_key={"a": "r1"})
    ledger2 = ledger_with(("a", 24, 24))
    ledger2.hold_running("x", ["a"], 20)
    runs = [MemoryRun("r1", 10, (("a",),)), MemoryRun("r2", 1, (("a",),))]
    assert plan_reference(runs, ledger2, holds) == []
