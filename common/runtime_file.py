"""``$XPUFLEET_HOME/runtime.json``: how same-machine clients and agents find the running sidecar.

``{"url", "host", "port", "pid", "token", "version", "home", "started_at", "tls_fingerprint",
"agent_socket"}``, written atomically with mode 0600 (the token is the session's credential) once the
server listens, removed when it stops. ``tls_fingerprint`` (``--tls``) is what same-machine clients pin;
``agent_socket`` is the server's Unix socket, where SSH workers' tunnels end.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Any

from ..constants import RUNTIME_FILENAME, home_dir
from . import atomic


def ensure_home(home: Path) -> Path:
    """Create the state directory (mode 0700: it holds the token and every run's data)."""
    home.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(OSError):
        os.chmod(home, 0o700)
    return home


def runtime_path(home: Path | None = None) -> Path:
    return (home if home is not None else home_dir()) / RUNTIME_FILENAME


def url_for(host: str, port: int, tls: bool = False) -> str:
    """The URL a same-machine client uses (a wildcard bind is reached through loopback)."""
    if host in ("0.0.0.0", "", "*"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def write_runtime(home: Path, info: dict[str, Any]) -> Path:
    """Write the runtime file atomically, readable by its owner only."""
    path = runtime_path(home)
    atomic.write_json(path, info, mode=atomic.PRIVATE)
    return path


def read_runtime(home: Path | None = None) -> dict[str, Any] | None:
    """The runtime file's contents, or None when missing or unreadable."""
    try:
        data = json.loads(runtime_path(home).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not data.get("url") or not data.get("token"):
        return None
    return data


def remove_runtime(home: Path, pid: int | None = None) -> bool:
    """Remove the runtime file (only when it belongs to ``pid``, if given)."""
    path = runtime_path(home)
    if pid is not None:
        data = read_runtime(home)
        if data is not None and data.get("pid") != pid:
            return False
    try:
        path.unlink()
        return True
    except FileNotFoundError:
        return False


def pid_alive(pid: int | None) -> bool:
    """True when a process with this pid exists (zombies count as gone)."""
    if not pid or pid <= 0:
        return False
    try:
        import psutil
    except ImportError:
        psutil = None  # type: ignore[assignment]
    if psutil is not None:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.AccessDenied:
            return True
        except psutil.Error:
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
