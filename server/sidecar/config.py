"""How a sidecar runs (``xpufleet start`` options and environment)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...constants import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    ENV_ALLOWED_HOSTS,
    ENV_RUN_QUEUE_MAX_CONCURRENT,
    MAX_REQUEST_BODY_BYTES,
    RUN_STOP_GRACE_S,
)
from .auth import new_token


@dataclass
class SidecarConfig:
    """How a sidecar runs. ``local_devices`` None = probe this machine; ``limits`` None = the env var."""

    home: Path
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    token: str = field(default_factory=new_token)
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = MAX_REQUEST_BODY_BYTES
    limits: str | None = None
    local_devices: list[dict[str, Any]] | None = None
    stop_grace_s: float = RUN_STOP_GRACE_S
    validate_local_graphs: bool = True
    # TLS (SPEC S3): ``tls`` serves HTTPS with ``tls_cert``/``tls_key``, or a certificate generated under
    # $XPUFLEET_HOME/tls; ``tls_fingerprint`` is set once the certificate is loaded.
    tls: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_fingerprint: str | None = None
    # The Unix socket (in XPUFLEET_HOME, owner only) where SSH workers' tunnels end; set once it listens.
    agent_socket: Path | None = None

    @staticmethod
    def from_env(home: Path, **kw: Any) -> SidecarConfig:
        extra = tuple(h for h in os.environ.get(ENV_ALLOWED_HOSTS, "").split(",") if h.strip())
        kw["allowed_hosts"] = tuple(kw.get("allowed_hosts") or ()) + extra
        kw.setdefault("limits", os.environ.get(ENV_RUN_QUEUE_MAX_CONCURRENT))
        return SidecarConfig(home=home, **kw)
