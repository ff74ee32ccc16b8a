"""What every part of the worker registry is given (docs/workers.md, "The registry's parts"): the shared worker
table, the dispatcher as the parts call it, and what they say about this server. Built once by
:class:`~.registry.WorkerRegistry` and handed to each part, which adds only its own dependencies."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .ports import RunsPort
from .state import ServerLinks, WorkerState
from .table import WorkerTable


@dataclass(frozen=True)
class PartContext:
    """``table``: every known worker and the store it mirrors; ``runs``: the dispatcher (run events back,
    providers changed, the slot view); ``links``: this server's token, URL, fingerprint and node types."""

    table: WorkerTable
    runs: RunsPort
    links: ServerLinks

    @property
    def store(self) -> Any:
        """The sidecar's store (server/sidecar/store.py), the one the table mirrors."""
        return self.table.store

    @property
    def workers(self) -> dict[str, WorkerState]:
        """Every known worker by name (the table's)."""
        return self.table.workers
