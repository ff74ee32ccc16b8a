"""The ``sbatch`` command line and the job script of a Slurm pool's job (pure; docs/slurm-and-k8s.md).

Every user value reaches the script through :func:`shlex.quote` on a line of its own, and ``sbatch``'s
options are separate argv items (no shell), so no value can add a line or a command. The pool's
credential is never in either: the script reads it from a 0600 file into the agent's environment
(``scontrol write batch_script`` and ``ps`` show the script and the command line, never the file).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ...constants import SLURM_JOB_NAME_PREFIX, WORKER_NAME_RE
from .spec import SlurmSpec, SpecError

NAME_PREFIX_LEN = 44  # pool name part of an instance's name: "<prefix>-slurm<job id>" stays within 64
_CUDA_RE = re.compile(r"^cuda:(\d+)$")


@dataclass(frozen=True)
class JobPaths:
    """Where a pool's jobs keep their files (a folder the nodes see)."""

    workdir: str
    credential: str  # the pool credential, mode 0600
    server: str  # line 1: the URL the agent connects to; line 2: the TLS fingerprint (or empty)

    @classmethod
    def under(cls, workdir: str) -> JobPaths:
        return cls(workdir, f"{workdir}/credential", f"{workdir}/server")

    def output(self) -> str:
        """sbatch --output (``%j``: the job id)."""
        return f"{self.workdir}/job-%j.out"

    def output_of(self, job_id: str) -> str:
        return f"{self.workdir}/job-{job_id}.out"


def job_name(tag: str) -> str:
    """The Slurm job name of every job of the pool with this tag (squeue --name finds them again)."""
    return f"{SLURM_JOB_NAME_PREFIX}{tag}"


def instance_name(pool: str, job_id: str) -> str:
    """The worker name the job's agent joins under."""
    return f"{pool[:NAME_PREFIX_LEN]}-slurm{job_id}"


def job_cards(spec: SlurmSpec, requested: Sequence[str]) -> int:
    """How many cards the job for a run asks for: the pool's per-job count, or more when the run's
    device set names higher cards (a ddp run's whole set goes into one job: cuda:0,cuda:1 -> 2)."""
    _, count = spec.gres_parts()
    indexes = [int(m.group(1)) for d in requested if (m := _CUDA_RE.match(str(d)))]
    return max([count] + [i + 1 for i in indexes])


def sbatch_argv(spec: SlurmSpec, tag: str, paths: JobPaths, cards: int) -> list[str]:
    """``sbatch --parsable ...`` (the script comes on stdin)."""
    gres_name, _ = spec.gres_parts()
    argv = ["sbatch", "--parsable", f"--job-name={job_name(tag)}", f"--output={paths.output()}",
            f"--gres={gres_name}:{cards}"]
    if spec.partition:
        argv.append(f"--partition={spec.partition}")
    if spec.account:
        argv.append(f"--account={spec.account}")
    if spec.time_limit:
        argv.append(f"--time={spec.time_limit}")
    return argv + list(spec.sbatch_args)


_SCRIPT = """#!/bin/bash
# One one-shot xpufleet agent that joins a pool (written by the sidecar: docs/slurm-and-k8s.md).
set -u
pool={pool}
workdir={workdir}
credential_file={credential}
server_file={server}
python={python}
simulate_gib={simulate}
comfyui={comfyui}
name={prefix}-slurm"${{SLURM_JOB_ID:-0}}"
server=$(sed -n 1p "$server_file")
fingerprint=$(sed -n 2p "$server_file")
args=(-m xpufleet.server agent start --one-shot --foreground --server "$server" --name "$name")
if [ -n "$fingerprint" ]; then args+=(--fingerprint "$fingerprint"); fi
if [ -n "$comfyui" ]; then args+=(--comfyui "$comfyui"); fi
if [ -n "$simulate_gib" ]; then
  visible=${{CUDA_VISIBLE_DEVICES:-}}
  sim=""
  i=0
  for _ in ${{visible//,/ }}; do sim="${{sim:+$sim,}}cuda:$i=$simulate_gib"; i=$((i + 1)); done
  if [ -n "$sim" ]; then args+=(--simulate "$sim"); fi
fi
echo "xpufleet: job ${{SLURM_JOB_ID:-?}} of pool $pool: agent $name, cards ${{CUDA_VISIBLE_DEVICES:-none}}"
XPUFLEET_AGENT_JOIN_TOKEN=$(cat "$credential_file") || exit 3
export XPUFLEET_AGENT_JOIN_TOKEN
export XPUFLEET_HOME="$workdir/home-${{SLURM_JOB_ID:-0}}"
exec "$python" "${{args[@]}}"
"""


def job_script(spec: SlurmSpec, pool: str, paths: JobPaths, comfyui: str | None = None) -> str:
    """The batch script: read the URL and the credential from their files, exec the one-shot agent
    (``comfyui``: the pool's ComfyUI folder, given to the agent as ``--comfyui``)."""
    if not WORKER_NAME_RE.match(pool):
        raise SpecError(f"invalid pool name {pool!r}")
    for label, value in (("workdir", paths.workdir), ("python", spec.python), ("comfyui", comfyui or "")):
        if any(ord(c) < 32 or ord(c) == 127 for c in value):
            raise SpecError(f"slurm.{label} contains a control character: write it on one line")
    q = shlex.quote
    return _SCRIPT.format(pool=q(pool), workdir=q(paths.workdir), credential=q(paths.credential),
                          server=q(paths.server), python=q(spec.python),
                          simulate=q("" if spec.simulate_gib is None else f"{spec.simulate_gib:g}"),
                          comfyui=q(comfyui or ""),
                          prefix=q(pool[:NAME_PREFIX_LEN]))
