"""Managing workers (docs/workers.md's Workers panel actions): a card's mode, drain/undrain, remove,
reissue, join tokens."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from ...common.secrets import new_secret
from ...constants import JOIN_TOKEN_TTL_S
from . import protocol
from .context import PartContext
from .ports import SshPort
from .records import MODES, SHAREABLE_KINDS, hash_secret
from .state import WorkerError, WorkerState


class WorkerManagement:
    """The Workers panel's actions on one worker (docs/workers.md)."""

    def __init__(self, ctx: PartContext, describe: Callable[[str], dict[str, Any]],
                 depart: Callable[[WorkerState], None], ssh: SshPort | None = None) -> None:
        """``ctx``: the table, the dispatcher (runs failed, providers changed), the links; ``describe``: the
        Workers panel's row; ``depart``: forgets a pool instance (pools.py); ``ssh``: the SSH workers, whose
        remote side a removal cleans up."""
        self.ctx = ctx
        self.describe = describe
        self.depart = depart
        self.ssh = ssh

    def set_mode(self, name: str, device: str, mode: Any) -> dict[str, Any]:
        """A card's mode on a worker (exclusive|shared), persisted across reconnects and restarts."""
        st = self.ctx.table.get(name)
        if mode not in MODES:
            raise WorkerError(f"mode must be \"exclusive\" or \"shared\", got {mode!r}")
        dev = next((d for d in st.devices if d["name"] == device), None)
        if dev is None:
            offered = ", ".join(d["name"] for d in st.devices) or "nothing"
            raise WorkerError(f"worker {name} does not offer {device} (it offers {offered})", 404)
        if mode == "shared" and dev["kind"] not in SHAREABLE_KINDS:
            raise WorkerError(f"{device} is a {dev['kind']} device: only CUDA and MPS cards can be shared by memory")
        with self.ctx.store.transaction() as db:
            db.execute(
                "INSERT INTO worker_device_modes(worker, device, mode, updated_at) VALUES (?,?,?,?)"
                " ON CONFLICT(worker, device) DO UPDATE SET mode=excluded.mode, updated_at=excluded.updated_at",
                (name, device, mode, time.time()))
        self.ctx.runs.providers_changed()
        return {"worker": name, "device": device, "mode": mode}

    def set_drained(self, name: str, drained: bool) -> dict[str, Any]:
        """Drain (no new runs; running runs finish) or undrain; the worker's row."""
        st = self.ctx.table.get(name)
        st.drained = drained
        with self.ctx.store.transaction() as db:
            db.execute("UPDATE workers SET drained=? WHERE name=?", (int(drained), name))
        self.ctx.runs.providers_changed()
        return self.describe(name)

    async def remove(self, name: str) -> dict[str, Any]:
        """Revoke the worker's credential, disconnect it, fail the runs waiting for it, and forget it."""
        st = self.ctx.table.get(name)
        failed: list[str] = []
        for run in self.ctx.table.queued_for(name):
            self.ctx.runs.run_ended(run["id"], "failed", f"worker {name} was removed while this run waited for it")
            failed.append(run["id"])
        interrupted: list[str] = []
        for run in self.ctx.table.active_runs(name):
            if st.conn is not None:
                await st.conn.send("forget_run", run_id=run["id"], reason=f"worker {name} was removed")
            self.ctx.runs.run_ended(run["id"], "interrupted", f"worker {name} was removed from the server")
            interrupted.append(run["id"])
        with self.ctx.store.transaction() as db:
            db.execute("DELETE FROM workers WHERE name=?", (name,))
            db.execute("DELETE FROM worker_device_modes WHERE worker=?", (name,))
        if st.grace_handle is not None:
            st.grace_handle.cancel()
        self.ctx.workers.pop(name, None)
        conn, st.conn = st.conn, None
        if conn is not None:
            await conn.send("reject", reason=f"worker {name} was removed from the server", removed=True)
            with contextlib.suppress(Exception):
                await conn.ws.close(code=4410, message=b"removed")
        if st.provider is not None:
            self.ctx.runs.unregister_provider(name)
        out: dict[str, Any] = {"removed": name, "failed_runs": failed, "interrupted_runs": interrupted}
        if self.ssh is not None and self.ssh.has(name):  # end ssh, delete what it stored on the host
            out["remote_cleanup"] = await self.ssh.forget(name)
        if st.pool is not None:
            self.depart(st)
        return out

    async def reissue(self, name: str, server_url: str | None = None) -> dict[str, Any]:
        """A new credential for a joined worker; the old one stops working at once.

        A connected worker gets the new credential over its connection (it keeps working); an offline
        one must join again, so a one-time join token for its name comes back too.
        """
        st = self.ctx.table.get(name)
        if st.auth == "ssh":
            raise WorkerError(f"worker {name} is an SSH worker: the server reaches it through ssh, it has no "
                              f"credential to reissue", 409)
        if st.pool is not None:
            raise WorkerError(f"worker {name} is an instance of pool {st.pool}: it joined with the pool's shared "
                              f"credential (xpufleet pools reissue {st.pool})", 409)
        if st.auth != "credential":
            raise WorkerError(
                f"worker {name} connects with this server's session token (same machine): it has no "
                f"credential to reissue", 409)
        credential = new_secret("xfc")
        with self.ctx.store.transaction() as db:
            db.execute("UPDATE workers SET credential_hash=? WHERE name=?", (hash_secret(credential), name))
        out: dict[str, Any] = {"name": name, "delivered": False}
        if st.conn is not None:
            out["delivered"] = await st.conn.send("credential", credential=credential)
        if not out["delivered"]:
            out.update(self.join_token(name, server_url=server_url))
        return out

    def join_token(self, name: str | None = None, ttl_s: float | None = None,
                   server_url: str | None = None) -> dict[str, Any]:
        """A one-time join token (only its hash is stored) and the command a remote machine runs."""
        bad_name = None if name is None else protocol.worker_name_problem(name)
        if bad_name:
            raise WorkerError(bad_name)
        ttl = JOIN_TOKEN_TTL_S if ttl_s is None else float(ttl_s)
        if not 60 <= ttl <= 30 * 24 * 3600:
            raise WorkerError("ttl_s must be between 60 and 2592000 seconds")
        token = new_secret("xfj", 24)
        now = time.time()
        with self.ctx.store.transaction() as db:
            db.execute("INSERT INTO worker_join_tokens(token_hash, name, created_at, expires_at) VALUES (?,?,?,?)",
                       (hash_secret(token), name, now, now + ttl))
        url = server_url or self.ctx.links.server_url() or "http://SERVER:PORT"
        fingerprint = self.ctx.links.tls_fingerprint()
        pin = f" --fingerprint {fingerprint}" if fingerprint and url.startswith("https://") else ""
        cmd = f"xpufleet agent start --server {url}{pin} --join {token}" + (f" --name {name}" if name else "")
        return {"join_token": token, "name": name, "expires_at": now + ttl, "command": cmd,
                "fingerprint": fingerprint}
