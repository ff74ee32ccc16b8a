"""The warm start of built-in model server instances on an agent (the recovery time of a guard restart).

A cold instance spends seconds on ``import torch`` before it can even rendezvous. The agent's warm
parent (run/warm.py: the standard library's forkserver, torch and the node modules preloaded, CUDA
never initialised) can fork any importable function; this starter forks :func:`instance_main`, which
becomes a process of its own exactly as a warm run does (own session, log, environment, stdin, event
pipe) and then runs the model server. Where warm starts are off, it starts the member's ``command``
cold (the launcher's ColdStarter), as does a failed warm start.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import sys
import threading
from pathlib import Path

from ..run.launcher import ColdStarter, MemberProcess, MemberSpec
from ..run.warm import PassFd, _WarmProcess, default_starter, warm_enabled


def instance_main(instance_dir: str, events_fd: int, stdin_fd: int, log_fd: int, env: dict[str, str]) -> None:
    """The forked child: its own process (like warm.member_main), then the model server."""
    os.setsid()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    os.close(log_fd)
    os.environ.clear()
    os.environ.update(env)
    os.chdir(instance_dir)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()
    from .model_server import serve

    stdin = os.fdopen(stdin_fd, "r", encoding="utf-8", errors="replace")
    sys.exit(serve(Path(instance_dir), events_fd, stdin))


class InstanceStarter:
    """Forks model server instances from the agent's warm parent; cold when warm starts are off."""

    name = "instance-warm"
    runs_commands = True

    def __init__(self) -> None:
        self._ctx = multiprocessing.get_context("forkserver")
        self._lock = threading.Lock()

    async def start(self, member: MemberSpec, events_fd: int) -> MemberProcess:
        if not warm_enabled() or default_starter().name != "warm":
            return await ColdStarter().start(member, events_fd)
        log_fd = os.open(member.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        stdin_r, stdin_w = os.pipe()
        try:
            proc = self._ctx.Process(
                target=instance_main, name=f"xpufleet-instance-{member.run_dir.name}",
                args=(str(member.run_dir), PassFd(events_fd), PassFd(stdin_r), PassFd(log_fd), dict(member.env)),
            )
            await asyncio.to_thread(self._start, proc)
        except BaseException:
            os.close(stdin_w)
            raise
        finally:
            os.close(stdin_r)
            os.close(log_fd)
        return _WarmProcess(proc, stdin_w)

    def _start(self, proc: multiprocessing.Process) -> None:
        with self._lock:
            proc.start()
        multiprocessing.process._children.discard(proc)  # type: ignore[attr-defined]  # the launcher supervises it


_STARTER: InstanceStarter | None = None


def instance_starter() -> InstanceStarter:
    """This agent's starter of model server instances (one per process)."""
    global _STARTER
    if _STARTER is None:
        _STARTER = InstanceStarter()
    return _STARTER
