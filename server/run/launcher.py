"""The one launcher of run processes: a *group* of N processes from one spec (N = 1 for a plain run).

Used by the sidecar's local provider and by the worker agent alike (and by ddp ranks and inference
unit instances, which are groups of several members). The split follows torch.distributed.elastic:
:class:`MemberSpec`/:class:`GroupSpec` say *what* to start (its worker spec), a starter (cold
subprocess or warm fork, see warm.py) says *how* a process comes to exist (its process context), and
:class:`ProcessGroup` supervises the members (its agent):

* it relays each member's events as they arrive (``on_events(rank, events)``), except the member's
  ``run_finished``, which it holds: a run reports its result only once every process of the group,
  and every process those started (DataLoader workers), has exited, so a slot is never reused while
  the run still works;
* :meth:`ProcessGroup.stop` delivers a stop to every member (``stop`` or ``interrupt`` on its stdin,
  the runner's cooperative stop) and kills the group after the grace period;
* when one member dies while the others still run (a crash, an out-of-memory kill, an exception),
  it ends the whole group and names that member and how it died (:attr:`GroupResult.first_failure`);
* :meth:`ProcessGroup.wait` returns only when every member has ended.

Each member runs ``xpufleet.server.run.runner`` on the run directory with its own environment
(``CUDA_VISIBLE_DEVICES`` / ``ZE_AFFINITY_MASK`` set before any device call), its own session (so its
process group can be killed as one), stdin a pipe, stdout and stderr to its log, and an event pipe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from ...constants import RUN_STOP_GRACE_S
from .events import describe_exit, parse_event_line

log = logging.getLogger("xpufleet.launcher")

RUNNER_MODULE = "xpufleet.server.run.runner"
MAX_EVENT_LINE_BYTES = 64 * 1024 * 1024
MEMBER_FAILURE_GRACE_S = 5.0  # after one member died, the others get this long after SIGTERM, then SIGKILL
GROUP_GONE_WAIT_S = 5.0  # how long a member's leftover processes get after it exited, before SIGKILL

EventsCallback = Callable[[int, list[dict[str, Any]]], None]
STOP_COMMANDS = {"cancel": b"stop\n", "interrupt": b"interrupt\n"}


class LaunchError(RuntimeError):
    """A member could not be started (the others that were are ended again)."""


@dataclass
class MemberSpec:
    """One process of a group: the run directory it executes, its environment and its log."""

    rank: int
    run_dir: Path
    env: dict[str, str]
    log_path: Path


@dataclass
class GroupSpec:
    """What to start: the members (rank 0 first) and how long a stop may take."""

    run_id: str
    members: list[MemberSpec]
    stop_grace_s: float = RUN_STOP_GRACE_S

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("a group needs at least one member")
        if [m.rank for m in self.members] != list(range(len(self.members))):
            raise ValueError("members must be ranks 0..N-1 in order")


@dataclass
class MemberExit:
    """How one member ended."""

    rank: int
    pid: int | None
    returncode: int | None
    finished: dict[str, Any] | None = None  # its run_finished payload, when it reported one

    @property
    def cause(self) -> str:
        """``exited with code 3 ...``, ``killed by SIGKILL (out of memory?)`` or the run's own error."""
        if self.finished is not None and self.finished.get("status") not in (None, "succeeded"):
            return str(self.finished.get("error") or self.finished.get("status"))
        if self.returncode is None:
            return "could not be started"
        return describe_exit(self.returncode) if self.returncode != 0 else "exited normally"

    @property
    def failed(self) -> bool:
        return self.returncode != 0


@dataclass
class GroupResult:
    """How the group ended: every member's exit, why it was stopped, the member that failed first,
    and rank 0's ``run_finished`` event (held until the whole group had ended)."""

    exits: list[MemberExit]
    stop_reason: str | None = None  # "cancel" | "interrupt" | "member_failed"
    first_failure: MemberExit | None = None
    finished_event: dict[str, Any] | None = None

    @property
    def world_size(self) -> int:
        return len(self.exits)


class MemberProcess(Protocol):
    """A started member, however it was started."""

    pid: int

    def send(self, data: bytes) -> None:
        """Write to the member's stdin (ignored once it is gone)."""

    def signal_group(self, sig: int) -> None:
        """Send ``sig`` to the member's process group (its DataLoader workers too)."""

    async def wait(self) -> int:
        """The exit code (negative: the signal that killed it)."""


class Starter(Protocol):
    """Makes one member's process: a cold subprocess or a fork of a warm parent."""

    name: str

    async def start(self, member: MemberSpec, events_fd: int) -> MemberProcess: ...


def signal_process_group(pid: int, sig: int) -> None:
    """``sig`` to the group led by ``pid`` (the member called setsid), else to ``pid`` alone."""
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)
    except PermissionError:
        pass


def group_alive(pgid: int) -> bool:
    """True while some live process of the process group ``pgid`` exists. A zombie does not count: a
    killed process whose parent has gone waits for its new parent (init, or a container's PID 1 that
    may never reap it) but holds no memory and does no work."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        import psutil
    except ImportError:
        return True
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                return True
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return False


async def wait_group_gone(pgid: int, timeout: float = GROUP_GONE_WAIT_S) -> None:
    """Wait until no process of ``pgid`` is left, killing the rest after ``timeout``.

    No kernel event says "this process group is empty", so this is a bounded, backing-off check
    (10 ms up to 100 ms); it usually returns on the first look.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    delay = 0.01
    killed = False
    while group_alive(pgid):
        if loop.time() >= deadline:
            if killed:
                log.warning("process group %d survived SIGKILL; giving up waiting for it", pgid)
                return
            log.warning("process group %d outlived its leader by %.1f s; killing it", pgid, timeout)
            signal_process_group(pgid, signal.SIGKILL)
            killed = True
            deadline = loop.time() + timeout
        await asyncio.sleep(delay)
        delay = min(delay * 2, 0.1)


class ColdStarter:
    """``python -m xpufleet.server.run.runner RUN_DIR --events-fd N`` as a new interpreter (1.5 to 4 s
    of ``import torch`` before the first node: the fallback when no warm parent is available)."""

    name = "cold"

    async def start(self, member: MemberSpec, events_fd: int) -> MemberProcess:
        import sys

        with open(member.log_path, "ab") as out:
            proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", RUNNER_MODULE, str(member.run_dir), "--events-fd", str(events_fd),
                stdin=asyncio.subprocess.PIPE, stdout=out, stderr=asyncio.subprocess.STDOUT,
                pass_fds=(events_fd,), env=member.env, cwd=str(member.run_dir), start_new_session=True,
            )
        return _ColdProcess(proc)


class _ColdProcess:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.pid = proc.pid

    def send(self, data: bytes) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None:
            with contextlib.suppress(Exception):
                self.proc.stdin.write(data)

    def signal_group(self, sig: int) -> None:
        if self.proc.returncode is None:
            signal_process_group(self.pid, sig)

    async def wait(self) -> int:
        return await self.proc.wait()


class _EventPipe(asyncio.Protocol):
    """Reads one member's JSON-lines event pipe and hands each chunk's complete lines over at once."""

    def __init__(self, rank: int, on_lines: Callable[[int, list[bytes]], None]) -> None:
        self.rank = rank
        self.on_lines = on_lines
        self.buf = bytearray()
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if b"\n" not in data:
            if len(self.buf) > MAX_EVENT_LINE_BYTES:
                log.warning("rank %d: dropping an event line over %d bytes", self.rank, MAX_EVENT_LINE_BYTES)
                self.buf.clear()
            return
        *lines, rest = bytes(self.buf).split(b"\n")
        self.buf = bytearray(rest)
        self.on_lines(self.rank, lines)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        if self.buf.strip():
            self.on_lines(self.rank, [bytes(self.buf)])
        self.buf.clear()
        if not self.closed.done():
            self.closed.set_result(None)


@dataclass
class _Member:
    spec: MemberSpec
    proc: MemberProcess | None = None
    finished: dict[str, Any] | None = None
    finished_event: dict[str, Any] | None = None
    exit: MemberExit | None = None
    task: asyncio.Task[None] | None = None
    kill_handle: asyncio.TimerHandle | None = None


@dataclass
class ProcessGroup:
    """Starts, supervises and stops one group of run processes (see the module docstring)."""

    spec: GroupSpec
    on_events: EventsCallback
    starter: Starter | None = None  # None: cold; the sidecar and the agent pass warm.default_starter()
    _members: list[_Member] = field(default_factory=list, init=False)
    _stop_reason: str | None = field(default=None, init=False)
    _first_failure: MemberExit | None = field(default=None, init=False)
    _done: asyncio.Event | None = field(default=None, init=False)

    @property
    def pids(self) -> list[int]:
        return [m.proc.pid for m in self._members if m.proc is not None]

    @property
    def stop_reason(self) -> str | None:
        return self._stop_reason

    async def start(self) -> None:
        """Start every member (in parallel); raise LaunchError, with the others ended, if one fails."""
        starter = self.starter or ColdStarter()
        self._done = asyncio.Event()
        self._members = [_Member(m) for m in self.spec.members]
        results = await asyncio.gather(*(self._start_member(starter, m) for m in self._members),
                                       return_exceptions=True)
        errors = [r for r in results if isinstance(r, BaseException)]
        for m in self._members:
            if m.proc is not None:
                m.task = asyncio.create_task(self._watch(m), name=f"xpufleet-{self.spec.run_id}-rank{m.spec.rank}")
        if errors:
            self._end_all(signal.SIGKILL)
            await self.wait()
            raise LaunchError(f"cannot start the run's process: {errors[0]}") from errors[0]
        if self._stop_reason is not None:  # a stop that came while starting
            self._deliver_stop(self._stop_reason)

    async def _start_member(self, starter: Starter, m: _Member) -> None:
        read_fd, write_fd = os.pipe()
        try:
            try:
                m.proc = await starter.start(m.spec, write_fd)
            except Exception as exc:
                if starter.name == "cold":
                    raise
                log.warning("warm start failed (%s); starting rank %d cold", exc, m.spec.rank)
                m.proc = await ColdStarter().start(m.spec, write_fd)
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        loop = asyncio.get_running_loop()
        m.transport, m.pipe = await loop.connect_read_pipe(  # type: ignore[attr-defined]
            lambda: _EventPipe(m.spec.rank, self._lines), os.fdopen(read_fd, "rb", buffering=0))

    def _lines(self, rank: int, lines: list[bytes]) -> None:
        member = self._members[rank]
        events = []
        for line in lines:
            ev = parse_event_line(line)
            if ev is None:
                if line.strip():
                    log.warning("run %s rank %d: ignoring a malformed event line %r", self.spec.run_id, rank, line[:200])
                continue
            if ev["type"] == "run_finished":
                member.finished_event = ev
                payload = ev.get("payload")
                member.finished = dict(payload) if isinstance(payload, dict) else {}
                continue  # held until the whole group has ended
            events.append(ev)
        if events:
            try:
                self.on_events(rank, events)
            except Exception:  # noqa: BLE001 - a store failure must not kill the reader
                log.exception("run %s: handling events failed", self.spec.run_id)

    async def _watch(self, m: _Member) -> None:
        assert m.proc is not None
        try:
            await m.pipe.closed  # type: ignore[attr-defined]
            rc = await m.proc.wait()
            await wait_group_gone(m.proc.pid)
        finally:
            m.transport.close()  # type: ignore[attr-defined]
            if m.kill_handle is not None:
                m.kill_handle.cancel()
        m.exit = MemberExit(m.spec.rank, m.proc.pid, rc, m.finished)
        if rc != 0 and self._stop_reason is None and self._first_failure is None:
            self._first_failure = m.exit
            if any(o.exit is None for o in self._members if o is not m):
                log.warning("run %s: rank %d of %d %s; ending the other ranks", self.spec.run_id, m.spec.rank,
                            len(self._members), m.exit.cause)
                self._stop_reason = "member_failed"
                self._end_all(signal.SIGTERM, then_kill_after=MEMBER_FAILURE_GRACE_S)
        if all(o.exit is not None or o.proc is None for o in self._members) and self._done is not None:
            self._done.set()

    def stop(self, reason: str) -> None:
        """Ask every member to stop: ``cancel`` (the run ends cancelled) or ``interrupt`` (the parent
        is going away; the run ends interrupted). Killed after the grace period."""
        if reason not in STOP_COMMANDS:
            raise ValueError(f"stop reason must be one of {', '.join(STOP_COMMANDS)}")
        if self._stop_reason is None or reason == "interrupt":
            self._stop_reason = reason
        self._deliver_stop(reason)

    def _deliver_stop(self, reason: str) -> None:
        loop = asyncio.get_running_loop()
        for m in self._members:
            if m.proc is None or m.exit is not None:
                continue
            m.proc.send(STOP_COMMANDS[reason])
            if m.kill_handle is None:
                m.kill_handle = loop.call_later(self.spec.stop_grace_s, m.proc.signal_group, signal.SIGKILL)

    def kill(self) -> None:
        """End every member now (SIGKILL to each process group)."""
        self._end_all(signal.SIGKILL)

    def _end_all(self, sig: int, then_kill_after: float | None = None) -> None:
        loop = asyncio.get_running_loop()
        for m in self._members:
            if m.proc is None or m.exit is not None:
                continue
            m.proc.signal_group(sig)
            if then_kill_after is not None:
                if m.kill_handle is not None:
                    m.kill_handle.cancel()
                m.kill_handle = loop.call_later(then_kill_after, m.proc.signal_group, signal.SIGKILL)

    async def wait(self) -> GroupResult:
        """Wait until every member (and whatever it started) has ended; how the group ended."""
        tasks = [m.task for m in self._members if m.task is not None]
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        exits = [m.exit or MemberExit(m.spec.rank, None, None) for m in self._members]
        rank0 = self._members[0] if self._members else None
        return GroupResult(exits=exits, stop_reason=self._stop_reason, first_failure=self._first_failure,
                           finished_event=rank0.finished_event if rank0 is not None else None)


def member_env(base: dict[str, str] | None, extra: dict[str, str]) -> dict[str, str]:
    """A member's environment: the parent's (or ``base``), then ``extra``, unbuffered output."""
    env = dict(os.environ if base is None else base)
    env.update(extra)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def single(run_id: str, run_dir: Path, env: dict[str, str], log_name: str = "output.log",
           stop_grace_s: float = RUN_STOP_GRACE_S) -> GroupSpec:
    """The group of a plain run: one member, rank 0, logging to ``output.log``."""
    return GroupSpec(run_id, [MemberSpec(0, run_dir, env, run_dir / log_name)], stop_grace_s)


def members_alive(pids: Sequence[int]) -> list[int]:
    """Those of ``pids`` whose process group still has a process (tests, status)."""
    return [p for p in pids if group_alive(p)]
