"""The one run host (docs/architecture.md, "A run's life"): a run's process group started, watched and
stopped the same way by the sidecar's local provider and by a worker agent, and ONE wording of how a
run's process died when it reported no result (exit code, signal, out-of-memory kill).

The launcher (launcher.py) supervises any group of processes; this module is the run-shaped use of it:
one member (rank 0, ``output.log``) started warm, events relayed from rank 0 only, and the outcome of a
group whose rank 0 never sent ``run_finished``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...constants import RUN_STOP_GRACE_S
from .launcher import GroupResult, MemberExit, ProcessGroup, Starter, single

RunEvents = Callable[[int, list[dict[str, Any]]], None]


def death_text(exit: MemberExit, worker: str | None = None) -> str:
    """How a run's process ended without a result, in words shared by every host:
    ``the run's process was killed by SIGKILL (out of memory?); see its log`` (``on worker W`` when an
    agent ran it)."""
    where = f" on worker {worker}" if worker else ""
    verb = "was " if exit.returncode is not None and exit.returncode < 0 else ""
    return f"the run's process{where} {verb}{exit.cause}; see its log"


def cancel_text(stop_grace_s: float) -> str:
    """A cancelled run whose process reported nothing: it was killed after the stop grace."""
    return f"cancelled; the run did not stop within {stop_grace_s:g} s and was killed"


@dataclass(frozen=True)
class Ending:
    """The terminal status and error of a run that reported no ``run_finished``."""

    status: str
    error: str


def ending_without_result(stop_reason: str | None, exit: MemberExit, *, interrupted: str,
                          stop_grace_s: float, worker: str | None = None) -> Ending:
    """The one rule for a run whose rank 0 reported nothing: stopped by its host (``interrupt``: the
    host was going away, ``interrupted`` with the host's reason), cancelled, or died by itself (failed)."""
    if stop_reason == "interrupt":
        return Ending("interrupted", interrupted)
    if stop_reason == "cancel":
        return Ending("cancelled", cancel_text(stop_grace_s))
    return Ending("failed", death_text(exit, worker))


class RunProcess:
    """One run's process group on this host (the sidecar or an agent): start, stop, kill, wait.

    ``on_events`` gets rank 0's events as they arrive (``run_finished`` is held by the launcher until
    every process of the group is gone, then it is :attr:`GroupResult.finished_event`)."""

    def __init__(self, run_id: str, run_dir: Path, env: dict[str, str], on_events: RunEvents, *,
                 starter: Starter | None = None, stop_grace_s: float = RUN_STOP_GRACE_S) -> None:
        self.run_id = run_id
        self.stop_grace_s = stop_grace_s
        self.group = ProcessGroup(single(run_id, run_dir, env, stop_grace_s=stop_grace_s),
                                  on_events=on_events, starter=starter)

    @property
    def pid(self) -> int | None:
        """Rank 0's pid once started."""
        pids = self.group.pids
        return pids[0] if pids else None

    async def start(self) -> None:
        """Start the process (a stop asked before is delivered once it runs); raises LaunchError."""
        await self.group.start()

    def stop(self, command: str) -> None:
        """``cancel`` (the run ends cancelled) or ``interrupt`` (the host is going away); killed after
        the stop grace."""
        self.group.stop(command)

    def kill(self) -> None:
        """End every process of the run now."""
        self.group.kill()

    async def wait(self) -> GroupResult:
        """Every process of the run has ended: how the group ended."""
        return await self.group.wait()

    def ending(self, result: GroupResult, *, interrupted: str, worker: str | None = None) -> Ending:
        """The outcome of ``result`` when rank 0 reported no result (see :func:`ending_without_result`)."""
        return ending_without_result(result.stop_reason, result.exits[0], interrupted=interrupted,
                                     stop_grace_s=self.stop_grace_s, worker=worker)
