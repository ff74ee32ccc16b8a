"""``squeue`` output as records (pure; docs/slurm-and-k8s.md)."""

from __future__ import annotations

from dataclasses import dataclass

SEP = "|"
FORMAT = SEP.join(("%i", "%T", "%r", "%j"))  # id, state (long), reason, name: `squeue -h -t all -o FORMAT`
# States in which a job still counts against max_jobs (squeue lists it by default)
LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED",
                         "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                         "RESV_DEL_HOLD", "SPECIAL_EXIT", "POWER_UP_NODE"})
GONE = "GONE"  # our own mark: a job squeue no longer lists (aged out of slurmctld's memory)


@dataclass(frozen=True)
class JobStatus:
    """One job as squeue shows it."""

    job_id: str
    state: str
    reason: str
    name: str

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES

    @property
    def text(self) -> str:
        """``PENDING (Resources)``, ``RUNNING``, ``FAILED (NonZeroExitCode)``."""
        return state_text(self.state, self.reason)


def state_text(state: str, reason: str | None) -> str:
    """A job's state with its reason when Slurm gives one."""
    return f"{state} ({reason})" if reason and reason not in ("None", "(null)") else state


def parse_squeue(text: str) -> list[JobStatus]:
    """The lines of ``squeue -h -t all -o FORMAT``; blank lines are skipped, a malformed one is an error."""
    jobs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.strip().split(SEP)
        if len(parts) < 4 or not parts[0].strip():
            raise ValueError(f"unexpected squeue line {line!r} (format {FORMAT})")
        job_id, state, reason = (p.strip() for p in parts[:3])
        jobs.append(JobStatus(job_id, state.split()[0].upper() if state else "UNKNOWN", reason,
                              SEP.join(parts[3:]).strip()))
    return jobs
