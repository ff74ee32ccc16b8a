"""The shared worker table (docs/workers.md): every known worker's :class:`WorkerState` by name, loaded from
SQLite at start, and the queries the registry's parts share (a worker's active and queued runs, a pool's
instances, a card's mode). One object, handed to each part that reads or changes the table."""

from __future__ import annotations

import json
from typing import Any

from .records import SCHEMA
from .state import WorkerError, WorkerState


class WorkerTable:
    """Every known worker by name (lives on the event loop), and the store it mirrors."""

    def __init__(self, store: Any) -> None:
        self.store = store
        SCHEMA.ensure(store)
        self.workers: dict[str, WorkerState] = {}
        for row in store.query("SELECT * FROM workers ORDER BY name"):
            self.workers[row["name"]] = WorkerState(
                name=row["name"], auth=row["auth"], drained=bool(row["drained"]), version=row["version"],
                env=json.loads(row["env"]), node_types=json.loads(row["node_types"]),
                devices=json.loads(row["devices"]), created_at=row["created_at"], last_seen=row["last_seen"],
            )

    def get(self, name: str) -> WorkerState:
        """The worker named ``name``; a 404 ``WorkerError`` when there is none."""
        st = self.workers.get(name)
        if st is None:
            raise WorkerError(f"no worker named {name!r} (see GET /api/workers)", 404)
        return st

    def active_runs(self, name: str | None = None) -> list[dict[str, Any]]:
        """The active runs on workers (all, or those of ``name``)."""
        runs = self.store.active()
        return [r for r in runs if r["worker_id"] and (name is None or r["worker_id"] == name)]

    def queued_for(self, name: str) -> list[dict[str, Any]]:
        """The runs queued for the worker ``name`` by name, oldest first (``{"id"}`` each)."""
        rows = self.store.query("SELECT id FROM runs WHERE status='queued' AND target=? ORDER BY seq", (name,))
        return [{"id": r["id"]} for r in rows]

    def instances(self, pool: str) -> list[WorkerState]:
        """The known instances of a one-shot pool, by name."""
        return [st for _, st in sorted(self.workers.items()) if st.pool == pool]

    def modes(self, name: str) -> dict[str, str]:
        """The cards of ``name`` whose mode was set (device -> exclusive|shared)."""
        rows = self.store.query("SELECT device, mode FROM worker_device_modes WHERE worker=?", (name,))
        return {r["device"]: r["mode"] for r in rows}

    def device_mode(self, name: str, device: str) -> str:
        """``exclusive`` (default) or ``shared``: whether the card admits runs by memory (server/memory)."""
        return self.modes(name).get(device, "exclusive")
