"""How an agent reaches its sidecar and what it offers; the files it keeps under ``$XPUFLEET_HOME/agents``."""

from __future__ import annotations

import json
import secrets
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...common import atomic
from ...common.runtime_file import read_runtime
from ...constants import AGENT_ADVERTISE_ADDR_DEFAULT, AGENT_WS_PATH, RUNTIME_FILENAME
from ..devices.simulated import SimulatedCard
from ..run.comfy_instances import ComfyInstall
from ..workers.protocol import POOL_SECRET_PREFIX, worker_name_problem


def agents_dir(home: Path) -> Path:
    """``$XPUFLEET_HOME/agents``: pid/state files, credentials, simulated cards, run dirs."""
    return Path(home) / "agents"


def state_file(home: Path, name: str) -> Path:
    """The agent's own pid/state file (``agent stop`` / ``agent status`` read it)."""
    return agents_dir(home) / f"{name}.json"


def credential_file(home: Path, name: str) -> Path:
    """Where a joined worker keeps its credential (mode 0600)."""
    return agents_dir(home) / f"{name}.credential.json"


def write_private_json(path: Path, data: dict[str, Any]) -> None:
    """Write JSON atomically with mode 0600 (credentials, state)."""
    atomic.write_json(path, data, mode=atomic.PRIVATE)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object from ``path``, or None when missing or unreadable."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_runtime_file(home: Path) -> dict[str, Any] | None:
    """The running sidecar's ``{"url", "token", ...}`` (``$XPUFLEET_HOME/runtime.json``), or None."""
    return read_runtime(Path(home))


def unix_socket_of(server_url: str) -> str | None:
    """The socket path of a ``unix:/path/agents.sock`` server URL (an SSH worker's tunnel), else None."""
    return server_url[len("unix:"):] if server_url.startswith("unix:") else None


def ws_url(server_url: str) -> str:
    """``http://host:port`` -> ``ws://host:port/api/agents/ws`` (https -> wss; ``unix:PATH`` -> the
    socket's ``ws://localhost/...``)."""
    url = server_url.rstrip("/")
    if unix_socket_of(url) is not None:
        return "ws://localhost" + AGENT_WS_PATH
    if url.startswith("https://"):
        url = "wss://" + url[len("https://"):]
    elif url.startswith("http://"):
        url = "ws://" + url[len("http://"):]
    elif not url.startswith(("ws://", "wss://")):
        url = "ws://" + url
    return url + AGENT_WS_PATH


@dataclass
class AgentConfig:
    """How an agent reaches its sidecar and what it offers."""

    name: str
    home: Path
    server: str | None = None  # URL; None: the runtime file's
    join_token: str | None = None
    devices: list[str] | None = None  # --devices filter (None: every card found)
    simulate: list[SimulatedCard] = field(default_factory=list)
    extra_env: dict[str, str] = field(default_factory=dict)
    mounts: dict[str, Path] = field(default_factory=dict)  # --mount label=folder (docs/workers.md)
    # --data-root DIR and XPUFLEET_DATA_ROOTS: folders graphs may read by absolute path (docs/workers.md)
    data_roots: list[Path] = field(default_factory=list)
    one_shot: bool = False  # take one run, exit when it ends (docs/workers.md)
    fingerprint: str | None = None  # --fingerprint: the TLS certificate pinned (docs/workers.md)
    # --advertise-addr: where the other workers' ddp ranks reach this one's (a spread run's rank 0 opens
    # its rendezvous store here; docs/architecture.md "ddp across workers")
    advertise_addr: str = AGENT_ADVERTISE_ADDR_DEFAULT
    # --comfyui PATH [--comfyui-python PY], $XPUFLEET_COMFYUI, or the ComfyUI this interpreter belongs to:
    # the ComfyUI its headless instances run (docs/workers.md, "Any workflow on a fleet card")
    comfyui: ComfyInstall | None = None


class AuthError(RuntimeError):
    """No way to authenticate to the sidecar (the message says what to pass)."""


@dataclass
class AuthChoice:
    url: str
    kind: str
    token: str
    fingerprint: str | None = None  # the server certificate's SHA-256, pinned for https URLs


def resolve_auth(cfg: AgentConfig) -> AuthChoice:
    """Pick the server URL and credential: join token, stored credential, or the runtime file.

    Re-read at every connection attempt, so a restarted sidecar (new port, new session token) is
    found again without restarting the agent.
    """
    runtime = read_runtime_file(cfg.home)
    cred = read_json(credential_file(cfg.home, cfg.name))
    url = cfg.server or (cred or {}).get("server") or (runtime or {}).get("url")
    if not url:
        raise AuthError(
            f"no server to connect to: start the sidecar on this machine (xpufleet start) so "
            f"{Path(cfg.home) / RUNTIME_FILENAME} exists, or pass --server URL"
        )
    same_cred = bool(cred) and (cfg.server is None or cred.get("server") == url)
    pin = cfg.fingerprint or ((cred or {}).get("fingerprint") if same_cred else None)
    if cfg.join_token:  # an explicit --join wins: joining (again) replaces any stored credential
        kind = "pool" if cfg.join_token.startswith(POOL_SECRET_PREFIX + "_") else "join"
        return AuthChoice(url, kind, cfg.join_token, pin)
    if cred and cred.get("credential") and same_cred:
        return AuthChoice(url, "credential", cred["credential"], pin)
    if runtime and runtime.get("token") and (cfg.server is None or _same_server(runtime.get("url"), url)):
        return AuthChoice(runtime.get("url") or url, "session", runtime["token"],
                          cfg.fingerprint or runtime.get("tls_fingerprint"))
    raise AuthError(
        f"no credential for {url}: get a join token from the server (Workers panel -> Add worker, or "
        f"POST /api/workers/join-tokens) and pass --join TOKEN"
    )


def _same_server(a: str | None, b: str | None) -> bool:
    return bool(a and b) and a.rstrip("/") == b.rstrip("/")


def default_name() -> str:
    """The worker name when ``--name`` is not given: this machine's hostname (no domain)."""
    host = socket.gethostname().split(".")[0]
    name = "".join(c if (c.isascii() and c.isalnum()) or c in "-_" else "-" for c in host).lstrip("-_")[:64]
    return name if worker_name_problem(name) is None else "worker"


def one_shot_name() -> str:
    """A one-shot agent's default name: the hostname and a random suffix (many share a machine)."""
    return f"{default_name()[:55]}-{secrets.token_hex(3)}"
