"""Guard decisions, the restart budget with exponential backoff, readiness and the service state (pure)."""

from __future__ import annotations

import itertools

import pytest

from xpufleet.server.units import lifecycle as lc
from xpufleet.server.units.spec import RestartPolicy

PLAIN = lambda: 0.5  # noqa: E731 - the jitter factor 1 (common/backoff.py): the plain figures


@pytest.mark.parametrize(("guard", "rank", "action"), [
    (True, 0, lc.RESTART_UNIT), (True, 1, lc.RESTART_UNIT), (True, 7, lc.RESTART_UNIT),
    (False, 0, lc.RESTART_UNIT), (False, 1, lc.RESTART_INSTANCE), (False, 5, lc.RESTART_INSTANCE),
])
def test_failure_action(guard, rank, action):
    assert lc.failure_action(guard, rank) == action


def test_backoff_doubles_up_to_the_cap_then_the_budget_ends():
    policy = RestartPolicy(max_restarts=6, window_s=100, backoff_s=0.5, backoff_max_s=4)
    history: list[float] = []
    delays = []
    for t in range(10):
        d = lc.next_restart_delay(policy, history, float(t), PLAIN)
        delays.append(d)
        if d is not None:
            history.append(float(t))
    assert delays == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0, None, None, None, None]


def test_restarts_leave_the_window():
    policy = RestartPolicy(max_restarts=2, window_s=10, backoff_s=1, backoff_max_s=10)
    assert lc.next_restart_delay(policy, [0.0, 1.0], 5.0) is None
    assert lc.next_restart_delay(policy, [0.0, 1.0], 10.5, PLAIN) == 2.0  # t=0 left the window, t=1 is still in it
    assert lc.next_restart_delay(policy, [0.0, 1.0], 11.0, PLAIN) == 1.0
    assert lc.restarts_in_window([0.0, 1.0, 9.0], 10.0, 10) == [1.0, 9.0]


def test_a_zero_budget_fails_at_the_first_failure():
    assert lc.next_restart_delay(RestartPolicy(max_restarts=0), [], 0.0) is None


def test_budget_delays_exhaustively():
    for n, base, cap in itertools.product(range(0, 5), (0.0, 0.1, 1.0), (1.0, 3.0)):
        policy = RestartPolicy(max_restarts=n, window_s=1000, backoff_s=base, backoff_max_s=cap)
        for k in range(7):
            d = lc.next_restart_delay(policy, [float(i) for i in range(k)], 100.0, PLAIN)
            assert d == (None if k >= n else min(cap, base * 2 ** k))


def test_barrier_and_readiness():
    assert lc.barrier_passed(["arrived", "arrived"])
    assert not lc.barrier_passed(["arrived", "running"]) and not lc.barrier_passed([])
    assert lc.all_alive(["running", "arrived"]) and not lc.all_alive(["running", "exited"])
    assert lc.may_become_ready("starting", ["arrived", "arrived"], True)
    assert lc.may_become_ready("recovering", ["arrived", "running"], True)  # guard off: rank 1 restarted alone
    assert not lc.may_become_ready("starting", ["arrived", "arrived"], False)
    assert not lc.may_become_ready("recovering", ["arrived", "exited"], True)
    for state in ("ready", "placing", "restarting", "draining", "stopping", "failed"):
        assert not lc.may_become_ready(state, ["arrived", "arrived"], True)


@pytest.mark.parametrize(("states", "replicas", "updating", "word"), [
    ([], 1, False, "stopped"),
    (["ready"], 1, False, "ready"),
    (["ready", "ready", "starting"], 2, False, "ready"),
    (["ready", "restarting"], 2, False, "degraded"),
    (["starting", "placing"], 2, False, "starting"),
    (["failed"], 1, False, "failed"),
    (["failed", "ready"], 2, False, "degraded"),
    (["ready"], 1, True, "updating"),
])
def test_service_state(states, replicas, updating, word):
    assert lc.service_state(states, replicas, updating) == word


def test_exit_cause():
    assert lc.exit_cause(-9) == "killed by SIGKILL"
    assert lc.exit_cause(3, "cannot read the model") == "exited with code 3: cannot read the model"
    assert lc.exit_cause(0) == "exited with code 0"
    assert lc.exit_cause(None) == "could not be started"
    assert lc.exit_cause(-200) == "killed by signal 200"
