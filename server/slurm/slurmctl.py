"""The Slurm CLI (``sbatch --parsable``, ``squeue``, ``scancel``) from the event loop (docs/slurm-and-k8s.md).

The CLI rather than slurmrestd: every Slurm site has the CLI on its login nodes with munge already set
up, while slurmrestd is optional, often off, and needs its own JWT or socket authentication. The
commands read ``SLURM_CONF`` from the sidecar's environment like any user's shell would.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from pathlib import Path

from ...constants import SLURM_CMD_TIMEOUT_S
from .squeue import FORMAT, JobStatus, parse_squeue


class SlurmError(RuntimeError):
    """A Slurm command failed; the text has its output."""


async def _run(argv: Sequence[str], stdin: str | None = None) -> str:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    except OSError as exc:
        raise SlurmError(f"cannot run {argv[0]}: {exc} (is the Slurm client installed and on PATH?)") from None
    try:
        out, err = await asyncio.wait_for(proc.communicate(stdin.encode() if stdin is not None else None),
                                          SLURM_CMD_TIMEOUT_S)
    except asyncio.TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise SlurmError(f"{argv[0]} did not answer within {SLURM_CMD_TIMEOUT_S:g} s") from None
    if proc.returncode != 0:
        text = (err or out).decode(errors="replace").strip()
        raise SlurmError(f"{argv[0]} failed (exit {proc.returncode}): {text[-500:]}")
    return out.decode(errors="replace")


async def submit(argv: Sequence[str], script: str) -> str:
    """Run ``sbatch --parsable ...`` with the script on stdin; the job id."""
    out = (await _run(argv, stdin=script)).strip()
    job_id = out.split(";", 1)[0].strip()  # "<id>[;<cluster>]"
    if not job_id.isdigit():
        raise SlurmError(f"sbatch printed {out!r}, not a job id")
    return job_id


async def query(names: Sequence[str]) -> list[JobStatus]:
    """Every job (pending, running and recently ended) with one of these job names."""
    if not names:
        return []
    return parse_squeue(await _run(["squeue", "-h", "-t", "all", f"--name={','.join(names)}", "-o", FORMAT]))


async def cancel(job_ids: Sequence[str]) -> None:
    """``scancel`` the jobs (one call)."""
    if job_ids:
        await _run(["scancel", *job_ids])


def output_tail(path: str, lines: int) -> list[str]:
    """The last lines of a job's output file (none when it is missing: the job never started)."""
    try:
        with open(Path(path), "rb") as fh:
            fh.seek(0, 2)
            size = fh.tell()
            fh.seek(max(0, size - 16384))
            text = fh.read().decode(errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]
