"""A Slurm pool's settings (docs/slurm-and-k8s.md): validated once, stored as JSON with the pool.

Every field is checked here so that a bad value is a 400 naming the field before anything is written
(no half-made pool), and so that what reaches ``sbatch`` and the job script is known to be safe to quote.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from ...constants import (
    SLURM_DEFAULT_GRES,
    SLURM_DEFAULT_IDLE_EXIT_S,
    SLURM_DEFAULT_MAX_JOBS,
    SLURM_DEFAULT_RETRIES,
)
from .sbatch_opts import OptionError, parse_sbatch_args

# Folders (os.pathsep-separated) where a pool's workdir may be, beside $XPUFLEET_HOME/slurm/POOL
WORKDIR_ROOTS_ENV = "XPUFLEET_SLURM_WORKDIR_ROOTS"

FIELDS = ("partition", "gres", "time_limit", "account", "sbatch_args", "python", "max_jobs", "idle_exit_s",
          "retries", "simulate_gib", "server_url", "workdir")
# Slurm's own names: partition and account are plain words; GRES is name[:type][:count]
_WORD_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
_GRES_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,31}(:[A-Za-z][A-Za-z0-9_.-]{0,31})?(:\d{1,3})?$")
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS
_TIME_RE = re.compile(r"^(\d{1,6}|\d{1,6}:\d{1,2}|\d{1,6}:\d{1,2}:\d{1,2}|\d{1,4}-\d{1,2}(:\d{1,2}){0,2})$")
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.\-\[\]:]+(/[^\s]*)?$")


class SpecError(ValueError):
    """A Slurm pool setting that cannot be used; the text names the field and what to write."""


@dataclass(frozen=True)
class SlurmSpec:
    """How a Slurm pool's jobs are submitted and what their agents do."""

    partition: str | None = None
    gres: str = SLURM_DEFAULT_GRES
    time_limit: str | None = None
    account: str | None = None
    sbatch_args: tuple[str, ...] = field(default_factory=tuple)
    python: str = "python3"  # the interpreter (or a venv's bin/python) on the node that imports xpufleet
    max_jobs: int = SLURM_DEFAULT_MAX_JOBS
    idle_exit_s: float = SLURM_DEFAULT_IDLE_EXIT_S
    retries: int = SLURM_DEFAULT_RETRIES
    simulate_gib: float | None = None  # tests/demos: each card Slurm gives becomes a simulated card this big
    server_url: str | None = None  # what the node's agent connects to (default: the sidecar's own URL)
    workdir: str | None = None  # outputs, credential file and agent homes (default: the sidecar's home)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["sbatch_args"] = list(self.sbatch_args)
        return out

    def gres_parts(self) -> tuple[str, int]:
        """``("gpu" or "gpu:a100", count)`` of the per-job GRES."""
        parts = self.gres.split(":")
        if len(parts) > 1 and parts[-1].isdigit():  # "gpu:2", "gpu:a100:2" (a type is never all digits)
            return ":".join(parts[:-1]), int(parts[-1])
        return self.gres, 1


def _no_control(name: str, value: str) -> None:
    if any(ord(c) < 32 or ord(c) == 127 for c in value):
        raise SpecError(f"slurm.{name} contains a control character (a newline, tab, ...): write it on one line")


def _text(raw: Mapping[str, Any], name: str, pattern: re.Pattern[str] | None, hint: str) -> str | None:
    value = raw.get(name)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise SpecError(f"slurm.{name} must be a non-empty string ({hint})")
    value = value.strip()
    _no_control(name, value)
    if pattern is not None and not pattern.match(value):
        raise SpecError(f"slurm.{name} {value!r} is not valid: {hint}")
    return value


def _number(raw: Mapping[str, Any], name: str, default: Any, low: float, high: float, integer: bool) -> Any:
    value = raw.get(name)
    if value is None:
        return default
    ok_type = isinstance(value, int) if integer else isinstance(value, int | float)
    if isinstance(value, bool) or not ok_type or value != value or not low <= value <= high:
        kind = "a whole number" if integer else "a number"
        raise SpecError(f"slurm.{name} must be {kind} from {low:g} to {high:g}, got {value!r}")
    return int(value) if integer else float(value)


def _sbatch_args(raw: Mapping[str, Any]) -> tuple[str, ...]:
    value = raw.get("sbatch_args")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise SpecError("slurm.sbatch_args must be a list of strings, e.g. [\"--qos=long\", \"--mem=8G\"]")
    for arg in value:
        _no_control("sbatch_args", arg)
    try:
        return parse_sbatch_args(value)
    except OptionError as exc:
        raise SpecError(str(exc)) from None


def confine_workdir(workdir: str, roots: Sequence[str]) -> None:
    """``workdir`` (symlinks resolved) must be one of ``roots`` or inside one; SpecError names the roots."""
    real = os.path.realpath(workdir)
    for root in roots:
        base = os.path.realpath(root)
        if os.path.commonpath([real, base]) == base:
            return
    shown = real if real != workdir else ""
    raise SpecError(f"slurm.workdir {workdir!r}{f' (that is {shown})' if shown else ''} is outside the folders a "
                    f"pool may use: {', '.join(roots)} (an operator adds more with {WORKDIR_ROOTS_ENV})")


def parse_spec(raw: Any) -> SlurmSpec:
    """Validate the ``slurm`` object of ``POST /api/pools``; raise :class:`SpecError` naming the field."""
    if raw is True:
        raw = {}
    if not isinstance(raw, Mapping):
        raise SpecError("slurm must be an object of settings (or true for the defaults)")
    unknown = sorted(set(raw) - set(FIELDS))
    if unknown:
        raise SpecError(f"slurm has unknown field(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
    gres = _text(raw, "gres", _GRES_RE, "NAME[:TYPE][:COUNT], e.g. gpu:1 or gpu:a100:2") or SLURM_DEFAULT_GRES
    python = _text(raw, "python", None, "the python on the node, e.g. /opt/venv/bin/python") or "python3"
    workdir = _text(raw, "workdir", None, "an absolute folder the nodes see")
    if workdir is not None and not workdir.startswith("/"):
        raise SpecError(f"slurm.workdir {workdir!r} must be an absolute path (a folder the nodes see)")
    simulate = raw.get("simulate_gib")
    return SlurmSpec(
        partition=_text(raw, "partition", _WORD_RE, "a partition name, e.g. gpu"),
        gres=gres,
        time_limit=_text(raw, "time_limit", _TIME_RE, "minutes, HH:MM:SS or D-HH:MM:SS, e.g. 01:00:00"),
        account=_text(raw, "account", _WORD_RE, "an account name"),
        sbatch_args=_sbatch_args(raw),
        python=python,
        max_jobs=_number(raw, "max_jobs", SLURM_DEFAULT_MAX_JOBS, 1, 1000, True),
        idle_exit_s=_number(raw, "idle_exit_s", SLURM_DEFAULT_IDLE_EXIT_S, 1, 86400, False),
        retries=_number(raw, "retries", SLURM_DEFAULT_RETRIES, 0, 20, True),
        simulate_gib=None if simulate is None else _number(raw, "simulate_gib", None, 0.001, 1e6, False),
        server_url=_text(raw, "server_url", _URL_RE, "http://HOST:PORT or https://HOST:PORT"),
        workdir=workdir,
    )


def spec_from_json(data: Mapping[str, Any]) -> SlurmSpec:
    """The stored form back (it was valid when stored)."""
    return parse_spec({k: v for k, v in data.items() if v is not None and v != []})
