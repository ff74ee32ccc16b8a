"""What a Slurm pool submits and cancels now (pure; docs/slurm-and-k8s.md).

One job per waiting run that no idle instance can take, never more than ``max_jobs`` live jobs (pending
+ running) at once. A job that has not joined yet belongs to one waiting run; when that run is gone
(cancelled, or taken by another instance) the job is given to another waiting run without one, and a
pending job nobody needs is cancelled. A job whose agent joined belongs to no run: the dispatcher gives
its instance whichever run comes first.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ...common import backoff
from ...constants import SLURM_RETRY_BASE_S, SLURM_RETRY_CAP_S


@dataclass(frozen=True)
class WaitingRun:
    """A queued run of the pool: the cards its job needs, and when a retry may be submitted."""

    run_id: str
    cards: int
    not_before: float = 0.0


@dataclass(frozen=True)
class JobView:
    """A job of the pool as the plan sees it."""

    job_id: str
    run_id: str | None
    cards: int
    live: bool
    pending: bool
    joined: bool


@dataclass(frozen=True)
class ScalePlan:
    """Submit one job for each run of ``submit``; cancel ``cancel``; ``assign``: job -> its run now."""

    submit: tuple[WaitingRun, ...] = ()
    cancel: tuple[str, ...] = ()
    assign: dict[str, str | None] = field(default_factory=dict)


def plan_scaling(waiting: Sequence[WaitingRun], jobs: Sequence[JobView], idle_cards: Sequence[int],
                 max_jobs: int, now: float) -> ScalePlan:
    """The plan for one tick: ``waiting`` in submission order, ``idle_cards`` the card count of each
    instance that joined and has taken no run."""
    uncovered: list[WaitingRun] = []
    idle = sorted(idle_cards)
    for run in waiting:  # idle instances take runs first (the dispatcher places them)
        fit = next((i for i, c in enumerate(idle) if c >= run.cards), None)
        if fit is None:
            uncovered.append(run)
        else:
            idle.pop(fit)
    open_jobs = [j for j in jobs if j.live and not j.joined]
    assign: dict[str, str | None] = {}
    by_run = {r.run_id: r for r in uncovered}
    for job in open_jobs:  # a job keeps its run while that run still needs one
        run = by_run.get(job.run_id or "")
        if run is not None and job.cards >= run.cards:
            assign[job.job_id] = run.run_id
            del by_run[run.run_id]
    cancel: list[str] = []
    for job in open_jobs:
        if job.job_id in assign:
            continue
        run = next((r for r in uncovered if r.run_id in by_run and job.cards >= r.cards), None)
        if run is not None:
            assign[job.job_id] = run.run_id
            del by_run[run.run_id]
        else:
            assign[job.job_id] = None
            if job.pending:
                cancel.append(job.job_id)
    room = max_jobs - sum(1 for j in jobs if j.live)
    submit = [r for r in uncovered if r.run_id in by_run and r.not_before <= now][:max(room, 0)]
    return ScalePlan(tuple(submit), tuple(cancel), assign)


def retry_backoff(failures: int, rand: Callable[[], float] = random.random) -> float:
    """Seconds before the next job for a run whose jobs failed ``failures`` times (exponential, capped,
    with a jitter in [0.5, 1.5) so that many pools' retries do not line up)."""
    return backoff.delay(failures, SLURM_RETRY_BASE_S, SLURM_RETRY_CAP_S, rand)
