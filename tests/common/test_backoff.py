"""The one backoff: exponential, capped, jittered in [0.5, 1.5) of the plain figure."""

from __future__ import annotations

import random

from xpufleet.common.backoff import Backoff, delay


def test_the_plain_figure_doubles_up_to_the_cap():
    assert [delay(k, 0.5, 4.0, lambda: 0.5) for k in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert delay(0, 0.5, 4.0, lambda: 0.5) == 0.5  # attempt 0 counts as the first


def test_the_jitter_spreads_retries_between_half_and_one_and_a_half_times():
    rng = random.Random(7)
    waits = [delay(3, 1.0, 30.0, rng.random) for _ in range(1000)]
    assert 2.0 <= min(waits) and max(waits) < 6.0
    assert max(waits) - min(waits) > 3.0  # spread out, not in lock-step
    assert delay(3, 1.0, 30.0, lambda: 0.0) == 2.0 and delay(3, 1.0, 30.0, lambda: 0.999999) < 6.0


def test_a_loop_counts_its_failures_and_starts_over_after_a_success():
    b = Backoff(1.0, 8.0, rand=lambda: 0.5)
    assert [b.next() for _ in range(5)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    b.reset()
    assert b.next() == 1.0
