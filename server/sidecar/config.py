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
    ENV_LOCAL_SHARED_CARDS,
    ENV_RUN_QUEUE_MAX_CONCURRENT,
    MAX_REQUEST_BODY_BYTES,
    RUN_STOP_GRACE_S,
)
from ..run.comfy_instances import ComfyInstall
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
    local_shared: tuple[str, ...] = ()  # this server's cards admitted by memory (off by default)
    # TLS (docs/workers.md): ``tls`` serves HTTPS with ``tls_cert``/``tls_key``, or a certificate generated under
    # $XPUFLEET_HOME/tls; ``tls_fingerprint`` is set once the certificate is loaded.
    tls: bool = False
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_fingerprint: str | None = None
    # The Unix socket (in XPUFLEET_HOME, owner only) where SSH workers' tunnels end; set once it listens.
    agent_socket: Path | None = None
    # --comfyui PATH [--comfyui-python PY]: this server runs ComfyUI runs (target local) in headless
    # ComfyUIs of its own (server/run/comfy_instances.py); None: it refuses them
    comfyui: ComfyInstall | None = None

    @staticmethod
    def from_env(home: Path, **kw: Any) -> SidecarConfig:
        extra = tuple(h for h in os.environ.get(ENV_ALLOWED_HOSTS, "").split(",") if h.strip())
        kw["allowed_hosts"] = tuple(kw.get("allowed_hosts") or ()) + extra
        kw.setdefault("limits", os.environ.get(ENV_RUN_QUEUE_MAX_CONCURRENT))
        kw.setdefault("local_shared", parse_local_shared(os.environ.get(ENV_LOCAL_SHARED_CARDS)))
        return SidecarConfig(home=home, **kw)


def parse_local_shared(text: str | None) -> tuple[str, ...]:
    """``XPUFLEET_LOCAL_SHARED_CARDS="cuda:0,cuda:1"``: this server's CUDA/MPS cards admitted by memory
    (beyond the seed: local runs are child processes, so their allocator can be capped). Raises ValueError
    naming the variable for a name that is not a CUDA or MPS card."""
    from ..devices.names import device_kind, normalize_device

    out: list[str] = []
    for raw in (text or "").split(","):
        if not raw.strip():
            continue
        try:
            name = normalize_device(raw.strip(), allow_kind=False)
        except ValueError as exc:
            raise ValueError(f"{ENV_LOCAL_SHARED_CARDS}: {exc}") from None
        if name == "mps":
            name = "mps:0"
        if device_kind(name) not in ("cuda", "mps"):
            raise ValueError(f"{ENV_LOCAL_SHARED_CARDS}: {name} is not a CUDA or MPS card (only those can be "
                             f"shared by memory)")
        out.append(name)
    return tuple(dict.fromkeys(out))
