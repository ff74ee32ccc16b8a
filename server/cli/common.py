"""What every ``xpufleet`` command shares: exit codes, error output, the running sidecar's client."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from ...common.client import ApiError, Client, SidecarUnreachable
from ...common.runtime_file import pid_alive, read_runtime, remove_runtime
from ...constants import home_dir
from .text import safe

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_UNREACHABLE = 0, 1, 2, 3


def err(msg: str) -> None:
    """An error line on stderr, prefixed ``xpufleet:`` (control characters escaped: it may quote a
    run's name or a server's message)."""
    print(f"xpufleet: {safe(msg, lines=True)}", file=sys.stderr)


def running_client(home: Path) -> tuple[Client, dict[str, Any]] | None:
    """A client for the sidecar of ``home`` when one is alive and answering; clears a stale file."""
    info = read_runtime(home)
    if info is None:
        return None
    if not pid_alive(info.get("pid")):
        remove_runtime(home)
        return None
    client = Client(info["url"], info.get("token"), timeout=5.0, fingerprint=info.get("tls_fingerprint"))
    try:
        client.health()
    except (SidecarUnreachable, ApiError):
        return None
    return client, info




def client_or_exit() -> Client:
    """The running sidecar's client (SidecarUnreachable -> exit code 3 in ``main``)."""
    client = Client.from_home(home_dir())
    client.health()
    return client
