"""Is a canvas run's ComfyUI alive, and is it the process that says so (docs/canvas-runs.md)?

A canvas run names its ComfyUI by pid. A pid alone proves nothing (``comfy_pid: 1`` is always alive), so
when the run is made the sidecar checks that the pid holds the very connection the request came on
(psutil lists the process's sockets; a process of another user cannot be read and is refused), and
records the process's start time: the run lives while a process with that pid and that start time does
(a reused pid is another process).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import psutil

START_TOLERANCE_S = 0.01  # create_time is read from the same clock tick each time; allow rounding


class NotTheCaller(ValueError):
    """The pid is not the process that sent the request; the text says why."""


def verify_caller(pid: int, peer: Any, local: Any) -> float:
    """The start time of process ``pid`` if it holds the TCP connection from ``peer`` to ``local``
    (``(host, port)`` pairs as the transport reports them); NotTheCaller otherwise."""
    try:
        proc = psutil.Process(pid)
        started = proc.create_time()
        lister = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6 names it connections
        conns = lister(kind="tcp")
    except psutil.NoSuchProcess:
        raise NotTheCaller(f"comfy_pid {pid}: no such process") from None
    except psutil.AccessDenied:
        raise NotTheCaller(f"comfy_pid {pid} is a process of another user, not the ComfyUI that sent this "
                           f"request") from None
    if not (isinstance(peer, tuple) and isinstance(local, tuple)):  # the connection is gone already
        raise NotTheCaller(f"comfy_pid {pid}: the request's connection closed before it could be matched")
    for c in conns:
        if c.laddr and c.raddr and c.laddr[1] == peer[1] and c.raddr[1] == local[1]:
            return started
    raise NotTheCaller(f"comfy_pid {pid} is not the process that sent this request: give ComfyUI's own pid "
                       f"(the plugin does)")


def comfy_alive(facts: Mapping[str, Any]) -> bool:
    """True while the ComfyUI a canvas run's ``execution_facts`` name still runs."""
    pid, started = facts.get("comfy_pid"), facts.get("comfy_started")
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return started is None or abs(proc.create_time() - float(started)) <= START_TOLERANCE_S
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return started is None  # it was ours when the run was made: another user's process is not it
