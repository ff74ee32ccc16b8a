"""The real test Slurm cluster (../shared/slurm/setup.sh; .ci/run starts it and exports SLURM_CONF) for
the Slurm pool e2e tests: its CLI, a sampler of squeue, and a job that holds every card (so that the
pool's jobs stay PENDING (Resources) while a test needs them pending).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any

import pytest

GPUS = 2  # setup.sh's default: the node's generic gpu resources


def _skip(reason: str) -> None:
    if os.environ.get("XPUFLEET_REQUIRE_SLURM"):  # .ci/run started the cluster: its absence is a failure
        pytest.fail(f"XPUFLEET_REQUIRE_SLURM is set but {reason}")
    pytest.skip(reason)


def require_slurm() -> None:
    """Skip (saying why) where no test cluster is up; fail instead under .ci/run."""
    if not os.environ.get("SLURM_CONF"):
        _skip("no SLURM_CONF: start the test cluster with `bash ../shared/slurm/setup.sh /tmp/xpufleet-slurm` "
                    "and export its SLURM_CONF line (.ci/run does)")
    if shutil.which("sbatch") is None or shutil.which("squeue") is None:
        _skip("the Slurm client (sbatch, squeue) is not installed: ../shared/slurm/setup.sh installs it")
    probe = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        _skip(f"the Slurm cluster of SLURM_CONF={os.environ['SLURM_CONF']} does not answer: {probe.stderr}")


def slurm(*args: str) -> str:
    out = subprocess.run(list(args), capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, (args, out.stderr)
    return out.stdout


def jobs(name: str, all_states: bool = False) -> list[tuple[str, str]]:
    """(id, state) of the jobs with this job name (live ones; with all_states, recently ended ones too)."""
    args = ["squeue", "-h", f"--name={name}", "-o", "%i|%T"] + (["-t", "all"] if all_states else [])
    return [tuple(line.split("|")) for line in slurm(*args).splitlines() if line.strip()]  # type: ignore[misc]


def wait_for(pred: Any, what: str, timeout: float = 60.0, every: float = 0.25) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)  # squeue and the Workers data have no push channel: bounded poll
    raise AssertionError(f"{what} not reached within {timeout} s")


class Sampler(threading.Thread):
    """Samples squeue for one job name until stopped: the most jobs it ever listed at once."""

    def __init__(self, name: str) -> None:
        super().__init__(daemon=True)
        self.name, self.most, self.samples, self.ids = name, 0, 0, set()
        self.stop_event = threading.Event()

    def run(self) -> None:
        while not self.stop_event.is_set():
            listed = jobs(self.name)
            self.most = max(self.most, len(listed))
            self.ids |= {i for i, _ in listed}
            self.samples += 1
            time.sleep(0.1)

    def stop(self) -> None:
        self.stop_event.set()
        self.join(30)


class Blocker:
    """A job holding every card of the node: jobs asking for a card stay PENDING (Resources)."""

    def __init__(self) -> None:
        out = slurm("sbatch", "--parsable", f"--gres=gpu:{GPUS}", "--job-name=xpufleet-test-blocker",
                    "--output=/dev/null", "--wrap", "sleep 600")
        self.job_id = out.strip().split(";")[0]
        wait_for(lambda: (self.job_id, "RUNNING") in jobs("xpufleet-test-blocker"), "the blocker job running")

    def release(self) -> None:
        subprocess.run(["scancel", self.job_id], capture_output=True, timeout=30)


def pool_body(name: str, **slurm_fields: Any) -> dict[str, Any]:
    """POST /api/pools for a Slurm pool whose agents run this test's python with simulated cards."""
    return {"name": name, "slurm": {"python": sys.executable, "simulate_gib": 8, "idle_exit_s": 5,
                                 "time_limit": "5", **slurm_fields}}
