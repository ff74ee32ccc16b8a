"""Instance and unit states, the guard decision and the restart budget (docs/services.md): pure rules.

Instance states (the sidecar's view of one instance of the current generation):

* ``waiting``: no card yet (queued in the slot system with the runs);
* ``starting``: sent to its agent, no process yet;
* ``running``: its process runs;
* ``arrived``: it reached the unit's barrier (the built-in model server: torch.distributed formed and
  its stage loaded; a command: it runs);
* ``exited``: its process ended (``last_exit`` says how);
* ``lost``: its worker stayed away longer than the resume grace.

Unit states: ``placing`` (instances wait for cards), ``starting`` (a generation was started, not ready
yet), ``ready`` (routable: every instance alive, the barrier passed, rank 0 answers its health check),
``recovering`` (guard off: one instance restarts alone; or a worker's connection is away), ``restarting``
(every instance is being ended for a new generation), ``draining`` (out of routing, finishing its
in-flight requests), ``stopping``, ``failed`` (the restart budget is spent; visible, not restarted).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence

from ...common import backoff
from .spec import RestartPolicy

INSTANCE_STATES = ("waiting", "starting", "running", "arrived", "exited", "lost")
ALIVE = frozenset({"running", "arrived"})
UNIT_STATES = ("placing", "starting", "ready", "recovering", "restarting", "draining", "stopping", "failed")
IN_SERVICE = frozenset({"placing", "starting", "ready", "recovering", "restarting"})  # counts as a replica
ENDING = frozenset({"draining", "stopping"})

RESTART_UNIT = "restart_unit"
RESTART_INSTANCE = "restart_instance"


def failure_action(guard: bool, rank: int) -> str:
    """What an instance failing does (docs/services.md): with guard, or when rank 0 fails, the whole unit restarts
    with a new generation; without guard another rank restarts alone (same generation and rendezvous:
    a torch.distributed/NCCL group on the survivors cannot take it back, the risk guard exists for)."""
    return RESTART_UNIT if guard or rank == 0 else RESTART_INSTANCE


def restarts_in_window(history: Iterable[float], now: float, window_s: float) -> list[float]:
    """The restart times still inside the budget's window."""
    return [t for t in history if now - t < window_s]


def next_restart_delay(policy: RestartPolicy, history: Sequence[float], now: float,
                       rand: Callable[[], float] = random.random) -> float | None:
    """Seconds to wait before the next restart, or None when the budget is spent (the unit fails).

    ``history``: times of the earlier restarts. The k-th restart within the window waits
    ``backoff_s * 2**(k-1)`` seconds, capped at ``backoff_max_s``, jittered (common/backoff.py; ``rand``
    returning 0.5 gives the plain figure); more than ``max_restarts`` within the window is the end.
    """
    recent = restarts_in_window(history, now, policy.window_s)
    if len(recent) >= policy.max_restarts:
        return None
    return backoff.delay(len(recent) + 1, policy.backoff_s, policy.backoff_max_s, rand)


def budget_text(policy: RestartPolicy) -> str:
    return f"{policy.max_restarts} restart(s) within {policy.window_s:g} s"


def barrier_passed(instance_states: Sequence[str]) -> bool:
    """Every instance of the generation arrived at the barrier."""
    return bool(instance_states) and all(s == "arrived" for s in instance_states)


def all_alive(instance_states: Sequence[str]) -> bool:
    return bool(instance_states) and all(s in ALIVE for s in instance_states)


def may_become_ready(unit_state: str, instance_states: Sequence[str], barrier: bool) -> bool:
    """The unit waits only for rank 0's health check: every instance alive, the barrier passed."""
    return unit_state in ("starting", "recovering") and barrier and all_alive(instance_states)


def service_state(unit_states: Sequence[str], replicas: int, updating: bool) -> str:
    """One word for a service: ``ready`` (``replicas`` units ready), ``updating``, ``failed`` (every unit
    failed), ``degraded`` (some ready, not all), ``starting`` (none ready yet), ``stopped`` (no unit)."""
    if updating:
        return "updating"
    if not unit_states:
        return "stopped"
    ready = sum(1 for s in unit_states if s == "ready")
    if all(s == "failed" for s in unit_states):
        return "failed"
    if ready >= replicas:
        return "ready"
    return "degraded" if ready else "starting"


def exit_cause(returncode: int | None, error: str | None = None) -> str:
    """How an instance ended, in words: ``killed by SIGKILL``, ``exited with code 3: <its error>``."""
    import signal

    if returncode is None:
        text = "could not be started"
    elif returncode < 0:
        try:
            text = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            text = f"killed by signal {-returncode}"
    else:
        text = f"exited with code {returncode}"
    return f"{text}: {error}" if error else text
