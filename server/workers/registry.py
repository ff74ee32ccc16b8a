"""The sidecar's side of worker agents (docs/sidecar.md, docs/workers.md).

* :class:`WorkerRegistry` keeps every known worker (SQLite tables registered through
  :meth:`Store.ensure_schema`, plus the live connection), authenticates agents (session token on the
  same machine, a per-worker credential for remote workers, one-time join tokens exchanged for that
  credential; only hashes are stored), records rejected connections with their reason, and serves one
  agent WebSocket at a time per worker (:meth:`WorkerRegistry.serve`).
* :class:`WorkerProvider` is a worker as the dispatcher sees it (the Provider protocol): its devices
  (with UUIDs, so one physical card offered by several providers is one slot), online/draining, and
  ``start_run`` / ``cancel`` sent over the WebSocket. A worker becomes a provider the first time it
  connects after the server started (docs/sidecar.md); while offline it stays one, so its runs wait.
* Resume grace: a worker that disconnects keeps its runs for ``XPUFLEET_WORKER_RESUME_GRACE_S``;
  when it comes back it replays their events (stored once, by ``seq``); after the grace they end
  ``interrupted``. After a sidecar restart the same applies from the start: runs still running on a
  worker are taken over when its agent reconnects.
* Management: drain/undrain, remove (revoke, disconnect, fail the runs waiting for it), reissue (a new
  credential pushed to a connected worker), join tokens, a card's mode (exclusive|shared, persisted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import protocol
from .management import WorkerManagement
from .outputs import OutputsAccess
from .pools import PoolManagement
from .records import SCHEMA, SCHEMA_NAME, SCHEMA_VERSION
from .session import AgentSessions
from .state import WorkerError, WorkerState
from .status import WorkersPanel

log = logging.getLogger("xpufleet.workers")


class WorkerRegistry(AgentSessions, WorkerManagement, PoolManagement, OutputsAccess, WorkersPanel):
    """Workers, their connections and their runs (one per sidecar; lives on the event loop)."""

    def __init__(
        self,
        store: Any,
        dispatcher: Any,
        session_token: Callable[[], str | None] | str | None,
        server_node_types: Callable[[], list[str]] | None = None,
        server_url: Callable[[], str | None] | str | None = None,
        tls_fingerprint: Callable[[], str | None] | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self._session_token = session_token
        self._server_node_types = server_node_types or _default_node_types
        self._server_url = server_url
        self._tls_fingerprint = tls_fingerprint
        self.workers: dict[str, WorkerState] = {}
        self.started_at = time.monotonic()
        self._grace_started = False
        self._announced_warnings: set[str] = set()
        self._uploading: set[str] = set()
        self._upload_tasks: set[asyncio.Task[Any]] = set()
        self.ssh: Any = None  # SshWorkers (server/ssh/manager.py), attached by the routes' setup
        self.slurm: Any = None  # SlurmPools (server/slurm/manager.py), attached by the routes' setup
        # Other parts' agent messages (message type -> handler(worker, msg)) and connection changes
        # (listener(worker, online)): inference unit instances (server/units).
        self.message_handlers: dict[str, Callable[[str, dict[str, Any]], Awaitable[None]]] = {}
        self.connection_listeners: list[Callable[[str, bool], None]] = []
        store.ensure_schema(SCHEMA_NAME, SCHEMA, SCHEMA_VERSION)
        spread = getattr(dispatcher, "spread", None)  # runs spread over workers (sidecar/spread.py)
        if spread is not None:
            self.message_handlers["part_finished"] = spread.on_part_finished
            self.connection_listeners.append(spread.on_connection)
        memory = getattr(dispatcher, "memory", None)
        if memory is not None:  # a card's mode decides whether it admits runs by memory
            memory.mode_of = self.device_mode
        for row in store.query("SELECT * FROM workers ORDER BY name"):
            self.workers[row["name"]] = WorkerState(
                name=row["name"], auth=row["auth"], drained=bool(row["drained"]), version=row["version"],
                env=json.loads(row["env"]), node_types=json.loads(row["node_types"]),
                devices=json.loads(row["devices"]), created_at=row["created_at"], last_seen=row["last_seen"],
            )
        self._init_pools()

    # --- small helpers ------------------------------------------------------------------------------
    def session_token(self) -> str | None:
        tok = self._session_token
        return tok() if callable(tok) else tok

    def server_url(self) -> str | None:
        url = self._server_url
        return url() if callable(url) else url

    def tls_fingerprint(self) -> str | None:
        """The certificate fingerprint join commands carry (None without --tls)."""
        return self._tls_fingerprint() if self._tls_fingerprint is not None else None

    def is_disabled(self, name: str) -> bool:
        """An SSH worker the user disabled (docs/workers.md)."""
        return self.ssh is not None and self.ssh.is_disabled(name)

    def server_node_types(self) -> list[str]:
        try:
            return list(self._server_node_types())
        except Exception:  # noqa: BLE001 - a broken node module must not break the worker list
            return []

    def _active_runs(self, name: str | None = None) -> list[dict[str, Any]]:
        runs = self.store.active()
        return [r for r in runs if r["worker_id"] and (name is None or r["worker_id"] == name)]

    def get(self, name: str) -> WorkerState:
        st = self.workers.get(name)
        if st is None:
            raise WorkerError(f"no worker named {name!r} (see GET /api/workers)", 404)
        return st

    # --- start-up: take over runs still running on workers -----------------------------------------
    def start(self) -> None:
        """After the dispatcher recovered: every worker with runs still active gets its resume grace.

        Runs the sidecar had sent to a worker before it restarted are taken over when the worker's
        agent reconnects and lists them; those of a worker that does not come back within the grace end
        ``interrupted``.
        """
        if self._grace_started:
            return
        self._grace_started = True
        for name in sorted({r["worker_id"] for r in self._active_runs()}):
            st = self.workers.get(name)
            if st is None:  # a run on a worker removed meanwhile
                st = self.workers[name] = WorkerState(name=name, created_at=time.time())
            if not st.online:
                st.disconnected_at = time.monotonic()
                self._schedule_grace(st)

    def _schedule_grace(self, st: WorkerState) -> None:
        if st.grace_handle is not None:
            st.grace_handle.cancel()
        loop = asyncio.get_running_loop()
        st.grace_handle = loop.call_later(protocol.resume_grace_s(), self._grace_expired, st.name)

    def _grace_expired(self, name: str) -> None:
        st = self.workers.get(name)
        if st is not None:
            st.grace_handle = None
            if st.online:
                return
        grace = protocol.resume_grace_s()
        for run in self._active_runs(name):
            log.warning("run %s: worker %s stayed away longer than the resume grace; interrupted", run["id"], name)
            self.dispatcher.run_ended(
                run["id"], "interrupted",
                f"worker {name} was disconnected for more than {grace:g} s (XPUFLEET_WORKER_RESUME_GRACE_S); "
                f"the run was interrupted",
            )
        if st is not None:
            self._maybe_depart(st)  # a one-shot instance that did not come back has left


    async def close(self) -> None:
        """Server stopping: close agent connections (they reconnect to the next server; runs go on)."""
        for task in list(self._upload_tasks):
            task.cancel()
        for st in list(self.workers.values()):
            if st.grace_handle is not None:
                st.grace_handle.cancel()
                st.grace_handle = None
            conn = st.conn
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.ws.close(code=1001, message=b"server stopping")




def _default_node_types() -> list[str]:
    from ...nodes import NODE_CLASS_MAPPINGS

    return sorted(NODE_CLASS_MAPPINGS)
