"""What the registry knows about one worker, and the error its management requests raise."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...common.errors import ApiError

if TYPE_CHECKING:
    from .provider import WorkerProvider
    from .session import Connection

MODES = ("exclusive", "shared")
SHAREABLE_KINDS = ("cuda", "mps")  # docs/workers.md: only CUDA and MPS cards, only on workers
REJECTIONS_KEPT = 200


class WorkerError(ApiError):
    """A management request that cannot apply; ``status`` is the HTTP code, the text what to fix."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(status, message)



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
    conn: Connection | None = None
    connected_since_start: bool = False
    last_heartbeat: float | None = None  # monotonic
    disconnected_at: float | None = None  # monotonic
    grace_handle: asyncio.TimerHandle | None = None
    provider: WorkerProvider | None = None
    mounts: dict[str, str] = field(default_factory=dict)  # storage mounts: label -> folder (docs/workers.md)
    one_shot: bool = False  # takes one run, then its agent exits (docs/workers.md)
    pool: str | None = None  # the one-shot pool this instance joined
    taken: str | None = None  # the run a one-shot worker took
    capabilities: tuple[str, ...] = ()  # from the agent's hello (e.g. "memory_cap")

    @property
    def online(self) -> bool:
        return self.conn is not None and not self.conn.closed
