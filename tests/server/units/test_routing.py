"""Routing choice (docs/services.md): only ready units, least outstanding requests, symmetric units (pure)."""

from __future__ import annotations

import itertools
import random

from xpufleet.server.units.routing import RouteView, choose_unit, no_unit_reason


def test_only_ready_units_are_chosen():
    units = [RouteView("a", False, 0), RouteView("b", True, 5), RouteView("c", False, 0)]
    assert choose_unit(units) == "b"
    assert choose_unit([RouteView("a", False), RouteView("b", False)]) is None
    assert choose_unit([]) is None


def test_least_outstanding_then_least_routed_then_index():
    units = [RouteView("a", True, 2, 0, 1), RouteView("b", True, 1, 9, 2), RouteView("c", True, 1, 3, 3)]
    assert choose_unit(units) == "c"
    assert choose_unit([RouteView("a", True, 0, 4, 2), RouteView("b", True, 0, 4, 1)]) == "b"


def test_equal_units_take_turns():
    """A sequence of requests on an idle service alternates between its symmetric units."""
    units = {u: RouteView(u, True, 0, 0, i) for i, u in enumerate("abc")}
    picks = []
    for _ in range(9):
        chosen = choose_unit(list(units.values()))
        picks.append(chosen)
        u = units[chosen]
        units[chosen] = RouteView(u.unit_id, True, 0, u.routed + 1, u.index)
    assert picks == list("abcabcabc")


def test_the_choice_is_a_minimum_over_ready_units():
    rng = random.Random(1)
    for _ in range(500):
        units = [RouteView(str(i), rng.random() < 0.6, rng.randrange(4), rng.randrange(4), i) for i in range(6)]
        chosen = choose_unit(units)
        ready = [u for u in units if u.ready]
        if not ready:
            assert chosen is None
            continue
        best = min((u.outstanding, u.routed, u.index) for u in ready)
        (pick,) = [u for u in units if u.unit_id == chosen]
        assert pick.ready and (pick.outstanding, pick.routed, pick.index) == best


def test_the_503_text_says_what_each_unit_does():
    text = no_unit_reason("digits", [RouteView("digits-2", False, index=2, state="restarting",
                                               detail="rank 1 killed by SIGKILL"),
                                     RouteView("digits-1", False, index=1, state="failed")], 10)
    assert text == ("service digits has no ready unit after waiting 10 s: unit digits-1 is failed; "
                    "unit digits-2 is restarting (rank 1 killed by SIGKILL)")
    assert "has no unit" in no_unit_reason("digits", [], 1)
    assert list(itertools.islice(text, 3)) == list("ser")
