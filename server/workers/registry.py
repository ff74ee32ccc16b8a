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

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import protocol
from .context import PartContext
from .grace import ResumeGrace
from .management import WorkerManagement
from .outputs import MAX_READ_BYTES, OutputsAccess
from .pools import PoolDirectory, PoolManagement
from .ports import RunsPort, SshPort
from .records import Rejections
from .session import AgentSessions, ConnectionListener, MessageHandler
from .state import ServerLinks, WorkerError, WorkerState
from .status import WorkersPanel
from .table import WorkerTable

__all__ = ["WorkerRegistry", "WorkerError", "WorkerState"]


class WorkerRegistry:
    """Workers, their connections and their runs (one per sidecar; lives on the event loop).

    A facade over its parts, each owning its state and given its dependencies here: the
    :class:`PartContext` they all share (the :class:`WorkerTable`, the dispatcher, the links),
    :class:`Rejections`, the Workers panel (:class:`WorkersPanel`), pools (:class:`PoolManagement` over the
    :class:`PoolDirectory` the dispatcher reads), management, recorded outputs, the resume grace and the
    agent sessions. The routes call the parts through it.
    """

    def __init__(self, table: WorkerTable, runs: RunsPort, links: ServerLinks, directory: PoolDirectory,
                 home: Path, ssh: SshPort | None = None,
                 part_holdings: Callable[[], dict[str, tuple[str, tuple[str, ...]]]] | None = None) -> None:
        """``table``: the worker table (also the dispatcher's ``mode_of``); ``runs``: the dispatcher;
        ``directory``: the pools as the dispatcher reads them; ``home``: XPUFLEET_HOME; ``ssh``: the SSH
        workers; ``part_holdings``: the cards of runs spread over workers (sidecar/spread.py)."""
        ctx = PartContext(table, runs, links)
        self.ctx = ctx
        self.ssh = ssh
        self.rejection_log = Rejections(table.store)
        self.panel = WorkersPanel(ctx, self.rejection_log, ssh, part_holdings)
        self.pools = PoolManagement(ctx, directory, self.panel.describe, self.panel.slot_state)
        self.management = WorkerManagement(ctx, self.panel.describe, self.pools.depart, ssh)
        self.outputs = OutputsAccess(table.workers, home, runs.ingest)
        self.grace = ResumeGrace(ctx, self.pools.maybe_depart)
        self.sessions = AgentSessions(ctx, self.rejection_log, self.pools, self.outputs, self.grace,
                                      self.is_disabled, self.panel.limit_warnings)

    @property
    def workers(self) -> dict[str, WorkerState]:
        """Every known worker by name (the shared table's)."""
        return self.ctx.workers

    # --- wiring (sidecar/app.py, once) ---------------------------------------------------------------------
    @property
    def slurm(self) -> Any:
        """The Slurm pools' manager (server/slurm/manager.py), or None."""
        return self.pools.slurm

    @slurm.setter
    def slurm(self, slurm: Any) -> None:
        self.pools.directory.attach_slurm(slurm)

    def register_handler(self, mtype: str, handler: MessageHandler) -> None:
        """Another part handles the agent messages of type ``mtype``."""
        self.sessions.register_handler(mtype, handler)

    def add_connection_listener(self, listener: ConnectionListener) -> None:
        """``listener(worker, online)`` is called when a worker's agent disconnects."""
        self.sessions.add_connection_listener(listener)

    # --- what the routes and the other parts call ----------------------------------------------------------
    def is_disabled(self, name: str) -> bool:
        """An SSH worker the user disabled (docs/workers.md)."""
        return self.ssh is not None and self.ssh.is_disabled(name)

    def tls_fingerprint(self) -> str | None:
        """The certificate fingerprint join commands carry (None without --tls)."""
        return self.ctx.links.tls_fingerprint()

    def get(self, name: str) -> WorkerState:
        """The worker named ``name`` (404 when unknown)."""
        return self.ctx.table.get(name)

    def instances(self, pool: str) -> list[WorkerState]:
        """The known instances of a one-shot pool."""
        return self.ctx.table.instances(pool)

    def device_mode(self, name: str, device: str) -> str:
        """A worker card's mode (exclusive|shared)."""
        return self.ctx.table.device_mode(name, device)

    async def serve(self, ws: Any, peer: str | None) -> None:
        """Serve one agent WebSocket (already prepared) until it closes."""
        await self.sessions.serve(ws, peer)

    def start(self) -> None:
        """After the dispatcher recovered: workers with active runs get their resume grace."""
        self.grace.start()

    async def close(self) -> None:
        """Server stopping: close agent connections (they reconnect to the next server; runs go on)."""
        self.outputs.close()
        self.grace.cancel_all()
        for st in list(self.workers.values()):
            conn = st.conn
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.ws.close(code=1001, message=b"server stopping")

    # --- the Workers panel (status.py) ---
    def list(self) -> list[dict[str, Any]]:
        """Every known worker but pool instances, by name."""
        return self.panel.list()

    def describe(self, name: str, state: Any = None) -> dict[str, Any]:
        """One worker as ``GET /api/workers`` lists it."""
        return self.panel.describe(name, state)

    def describe_this_server(self) -> dict[str, Any] | None:
        """This server's own machine as a Workers panel row."""
        return self.panel.describe_this_server()

    def limit_warnings(self, name: str | None = None) -> list[str]:
        """Overrides lowered by another provider of the same card."""
        return self.panel.limit_warnings(name)

    def rejections(self, limit: int = 50) -> list[dict[str, Any]]:
        """Refused agent connections, newest first."""
        return self.rejection_log.latest(limit)

    # --- management (management.py) ---
    def set_mode(self, name: str, device: str, mode: Any) -> dict[str, Any]:
        """A card's mode on a worker (exclusive|shared)."""
        return self.management.set_mode(name, device, mode)

    def set_drained(self, name: str, drained: bool) -> dict[str, Any]:
        """Drain or undrain a worker."""
        return self.management.set_drained(name, drained)

    async def remove(self, name: str) -> dict[str, Any]:
        """Remove a worker (revoke, disconnect, fail its waiting runs)."""
        return await self.management.remove(name)

    async def reissue(self, name: str, server_url: str | None = None) -> dict[str, Any]:
        """A new credential for a joined worker."""
        return await self.management.reissue(name, server_url)

    def join_token(self, name: str | None = None, ttl_s: float | None = None,
                   server_url: str | None = None) -> dict[str, Any]:
        """A one-time join token and its command."""
        return self.management.join_token(name, ttl_s, server_url)

    # --- pools (pools.py) ---
    def list_pools(self) -> list[dict[str, Any]]:
        """Every pool's row."""
        return self.pools.list_pools()

    def describe_pool(self, name: str) -> dict[str, Any]:
        """One pool's row."""
        return self.pools.describe_pool(name)

    def create_pool(self, name: Any, server_url: str | None = None, slurm: Any = None,
                    comfyui: str | None = None) -> dict[str, Any]:
        """A new pool and its shared credential (``comfyui``: its instances run ComfyUI workflows)."""
        return self.pools.create_pool(name, server_url, slurm, comfyui)

    def reissue_pool(self, name: str, server_url: str | None = None) -> dict[str, Any]:
        """A new credential for a pool."""
        return self.pools.reissue_pool(name, server_url)

    def revoke_pool(self, name: str) -> dict[str, Any]:
        """A pool's credential stops working."""
        return self.pools.revoke_pool(name)

    def export_pool(self, name: str, body: dict[str, Any], server_url: str | None = None) -> dict[str, Any]:
        """Kubernetes manifests whose pods join the pool."""
        return self.pools.export_pool(name, body, server_url)

    async def remove_pool(self, name: str) -> dict[str, Any]:
        """Delete a pool."""
        return await self.pools.remove_pool(name)

    async def dismiss(self, st: WorkerState, reason: str) -> None:
        """Tell an idle pool instance to leave, and forget it."""
        await self.pools.dismiss(st, reason)

    # --- recorded outputs (outputs.py) ---
    def uploaded_dir(self, run_id: str) -> Path:
        """Where the sidecar keeps a run's recorded outputs."""
        return self.outputs.uploaded_dir(run_id)

    async def fetch(self, worker: str, run_id: str, name: str, offset: int = 0,
                    length: int = protocol.OUTPUTS_CHUNK_BYTES, scope: str = "outputs") -> tuple[bytes, int, bool]:
        """One chunk of a file on a worker."""
        return await self.outputs.fetch(worker, run_id, name, offset, length, scope)

    async def read_whole(self, worker: str, run_id: str, name: str, limit: int = MAX_READ_BYTES,
                         scope: str = "outputs") -> bytes:
        """A whole file from a worker."""
        return await self.outputs.read_whole(worker, run_id, name, limit, scope)
