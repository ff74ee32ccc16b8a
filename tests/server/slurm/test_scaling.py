"""The scaling decision and the retry backoff (server/slurm/scaling.py)."""

from __future__ import annotations

from xpufleet.constants import SLURM_RETRY_BASE_S, SLURM_RETRY_CAP_S
from xpufleet.server.slurm.scaling import JobView, WaitingRun, plan_scaling, retry_backoff


def _runs(n, cards=1):
    return [WaitingRun(f"r{i}", cards) for i in range(n)]


def _job(job_id, run_id, pending=True, joined=False, live=True, cards=1):
    return JobView(job_id, run_id, cards, live, pending, joined)


def test_one_job_per_waiting_run_up_to_max_jobs():
    plan = plan_scaling(_runs(5), [], [], 2, now=0)
    assert [r.run_id for r in plan.submit] == ["r0", "r1"] and not plan.cancel
    # two live jobs: nothing more until one ends
    plan = plan_scaling(_runs(5), [_job("1", "r0"), _job("2", "r1")], [], 2, now=0)
    assert plan.submit == () and plan.assign == {"1": "r0", "2": "r1"}
    # joined jobs still count against max_jobs, but no longer belong to a run
    plan = plan_scaling(_runs(3)[1:], [_job("1", "r0", pending=False, joined=True)], [], 2, now=0)
    assert [r.run_id for r in plan.submit] == ["r1"]


def test_idle_instances_take_runs_before_jobs_are_submitted():
    plan = plan_scaling(_runs(3), [], [1, 1], 4, now=0)
    assert [r.run_id for r in plan.submit] == ["r2"]
    plan = plan_scaling(_runs(1, cards=2), [], [1], 4, now=0)  # a one-card instance cannot take a 2-card run
    assert [(r.run_id, r.cards) for r in plan.submit] == [("r0", 2)]


def test_a_pending_job_whose_run_is_gone_goes_to_another_run_or_is_cancelled():
    plan = plan_scaling([WaitingRun("r1", 1)], [_job("1", "r0"), _job("2", "r1")], [], 4, now=0)
    assert plan.cancel == ("1",) and plan.assign == {"1": None, "2": "r1"}
    plan = plan_scaling([WaitingRun("r2", 1)], [_job("1", "r0")], [], 4, now=0)
    assert plan.assign == {"1": "r2"} and plan.submit == () and plan.cancel == ()
    # a running job that has not joined yet is never cancelled (its agent may be taking a run)
    plan = plan_scaling([], [_job("1", "r0", pending=False)], [], 4, now=0)
    assert plan.cancel == () and plan.assign == {"1": None}
    # an adopted job (no run) after a restart takes a waiting run: nothing submitted twice
    plan = plan_scaling(_runs(1), [_job("7", None)], [], 4, now=0)
    assert plan.assign == {"7": "r0"} and plan.submit == ()


def test_a_retry_waits_for_its_backoff():
    plan = plan_scaling([WaitingRun("r0", 1, not_before=10.0)], [], [], 4, now=5.0)
    assert plan.submit == ()
    assert [r.run_id for r in plan_scaling([WaitingRun("r0", 1, not_before=10.0)], [], [], 4, now=10.0).submit] == ["r0"]


def test_backoff_doubles_is_capped_and_jittered():
    assert retry_backoff(1, lambda: 0.5) == SLURM_RETRY_BASE_S
    assert retry_backoff(3, lambda: 0.5) == SLURM_RETRY_BASE_S * 4
    assert retry_backoff(50, lambda: 0.5) == SLURM_RETRY_CAP_S
    assert retry_backoff(2, lambda: 0.0) == SLURM_RETRY_BASE_S and retry_backoff(2, lambda: 0.999) < 3 * SLURM_RETRY_BASE_S
