"""One backoff for every retry loop (agent reconnects, SSH tunnels, unit restarts, Slurm job retries):
exponential, capped, and jittered, so that many agents whose sidecar restarted do not all reconnect in
the same instant (docs/architecture.md, "Layers")."""

from __future__ import annotations

import random
from collections.abc import Callable


def delay(attempt: int, first_s: float, max_s: float, rand: Callable[[], float] = random.random) -> float:
    """Seconds before retry ``attempt`` (1 = the first): ``first_s * 2**(attempt - 1)`` capped at
    ``max_s``, times a jitter drawn from [0.5, 1.5) (``rand`` returns [0, 1); 0.5 gives the plain value)."""
    return min(max_s, first_s * 2 ** max(attempt - 1, 0)) * (0.5 + rand())


class Backoff:
    """The state of one retry loop: :meth:`next` gives the next wait, :meth:`reset` after a success."""

    def __init__(self, first_s: float, max_s: float, rand: Callable[[], float] = random.random) -> None:
        self.first_s, self.max_s, self.rand = first_s, max_s, rand
        self.attempt = 0

    def next(self) -> float:
        """The wait before the next attempt (each call counts one more failure)."""
        self.attempt += 1
        return delay(self.attempt, self.first_s, self.max_s, self.rand)

    def reset(self) -> None:
        """A success: the next failure waits ``first_s`` again (about)."""
        self.attempt = 0
