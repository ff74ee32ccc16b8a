"""The warm start of built-in model server instances on an agent (the recovery time of a guard restart).

A cold instance spends seconds on ``import torch`` before it can even rendezvous. The agent's warm
parent (run/warm.py: the standard library's forkserver, torch and the node modules preloaded, CUDA
never initialised) can fork any importable function; this starter forks :func:`instance_main`, which
becomes a process of its own exactly as a warm run does (own session, log, environment, stdin, event
pipe) and then runs the model server. Where warm starts are off, it starts the member's ``command``
cold (the launcher's ColdStarter), as does a failed warm start.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ..run.launcher import ColdStarter, MemberProcess, MemberSpec
from ..run.warm import WarmStarter, become_member, default_starter, warm_enabled


def instance_main(instance_dir: str, events_fd: int, stdin_fd: int, log_fd: int, env: dict[str, str]) -> None:
    """The forked child: its own process (as a warm run's), then the model server."""
    become_member(instance_dir, log_fd, env)
    from .model_server import serve

    stdin = os.fdopen(stdin_fd, "r", encoding="utf-8", errors="replace")
    sys.exit(serve(Path(instance_dir), events_fd, stdin))


class InstanceStarter:
    """Forks model server instances from the agent's warm parent; cold when warm starts are off."""

    name = "instance-warm"
    runs_commands = True

    async def start(self, member: MemberSpec, events_fd: int) -> MemberProcess:
        starter = default_starter()
        if not warm_enabled() or not isinstance(starter, WarmStarter):
            return await ColdStarter().start(member, events_fd)
        return await starter.fork(instance_main, f"xpufleet-instance-{member.run_dir.name}", member, events_fd)


_STARTER: InstanceStarter | None = None


def instance_starter() -> InstanceStarter:
    """This agent's starter of model server instances (one per process)."""
    global _STARTER
    if _STARTER is None:
        _STARTER = InstanceStarter()
    return _STARTER
