"""What the registry knows about one worker, and the error its management requests raise."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ...common.errors import ApiError


class WorkerError(ApiError):
    """A management request that cannot apply; ``status`` is the HTTP code, the text what to fix."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(status, message)



class AgentLink(Protocol):
    """One agent's live connection as the rest of the registry sees it (session.py's ``Connection``)."""

    ws: Any
    name: str
    peer: str | None
    pending: dict[str, asyncio.Future[dict[str, Any]]]

    @property
    def closed(self) -> bool: ...

    async def send(self, mtype: str, **fields: Any) -> bool: ...


@dataclass
class ServerLinks:
    """What the registry's parts say about this server: its session token, URL, TLS fingerprint and node types
    (callables: the config may learn them after start-up, e.g. the port)."""

    session_token: Callable[[], str | None]
    server_url: Callable[[], str | None] = lambda: None
    tls_fingerprint: Callable[[], str | None] = lambda: None
    node_types: Callable[[], list[str]] | None = None

    def server_node_types(self) -> list[str]:
        """This server's node types; [] when the node modules fail to import (the list must still show)."""
        try:
            return list((self.node_types or _default_node_types)())
        except Exception:  # noqa: BLE001 - a broken node module must not break the worker list
            return []


def _default_node_types() -> list[str]:
    from ...nodes import NODE_CLASS_MAPPINGS

    return sorted(NODE_CLASS_MAPPINGS)


@dataclass
class WorkerState:
    """What the registry knows about one worker (persisted parts mirror the ``workers`` row)."""

    name: str
    auth: str = "session"
    drained: bool = False
    version: str | None = None
    env: dict[str, Any] = field(default_factory=dict)
    node_types: list[str] = field(default_factory=list)
    devices: list[dict[str, Any]] = field(default_factory=list)
    created_at: float = 0.0
    last_seen: float | None = None  # wall clock of the last message
    conn: AgentLink | None = None
    connected_since_start: bool = False
    last_heartbeat: float | None = None  # monotonic
    disconnected_at: float | None = None  # monotonic
    grace_handle: asyncio.TimerHandle | None = None
    provider: Any = None  # its WorkerProvider (provider.py) once it has connected
    mounts: dict[str, str] = field(default_factory=dict)  # storage mounts: label -> folder (docs/workers.md)
    one_shot: bool = False  # takes one run, then its agent exits (docs/workers.md)
    pool: str | None = None  # the one-shot pool this instance joined
    taken: str | None = None  # the run a one-shot worker took
    capabilities: tuple[str, ...] = ()  # from the agent's hello (e.g. "memory_cap")
    # Its ComfyUI (server/comfyflow/reading.py): "none", "probing" (hello announced one, its ``comfyui``
    # message has not come yet), "ready" or "failed"; the reading is kept while the worker is offline.
    comfyui_state: str = "none"
    comfyui: Any = None  # the comfyflow Reading of its last ``comfyui`` message

    @property
    def online(self) -> bool:
        return self.conn is not None and not self.conn.closed
