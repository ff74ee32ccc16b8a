"""One-shot worker pools (docs/workers.md): a shared credential that many instances join with; each instance
is a one-shot agent that takes exactly one run and exits when it ends.

* ``create`` gives the credential (``xfp_...``, only its hash is kept) and the command an instance runs
  (``xpufleet agent start --one-shot --join TOKEN``, e.g. in a batch job or a cloud instance's start-up).
* An instance joins under its own name (one-shot agents default to the hostname plus a random suffix);
  it is listed with its pool while it is connected or still has a run, and forgotten once it has left
  (departed instances are not listed).
* ``target.pool`` routes a run to an idle instance (the dispatcher reads :class:`PoolDirectory`: pool -> live
  instances, the closed pools, why a pool run waits);
  a run waits while none is idle. An instance is never chosen for ``any`` or by name.
* ``revoke`` makes the credential stop working (new instances are refused, with the reason shown under
  "Rejected connections"; runs already on instances go on); ``reissue`` gives a new credential;
  ``remove`` deletes the pool and fails the runs waiting for it.
"""

from __future__ import annotations

import contextlib
import shlex
import time
from collections.abc import Callable
from typing import Any

from ...common.schema import Schema
from ...common.secrets import new_secret
from ..slurm.spec import SpecError, parse_spec
from . import k8s, protocol
from .context import PartContext
from .panel_view import instance_state, waiting_runs
from .records import hash_secret
from .state import WorkerError, WorkerState
from .table import WorkerTable

SCHEMA = Schema("pools", 1, """
CREATE TABLE IF NOT EXISTS worker_pools (
    name TEXT PRIMARY KEY,
    credential_hash TEXT,
    created_at REAL NOT NULL,
    revoked_at REAL
);
CREATE TABLE IF NOT EXISTS pool_comfyui (
    pool TEXT PRIMARY KEY,
    path TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS pool_instances (
    name TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    joined_at REAL NOT NULL
);
""")


class PoolDirectory:
    """What the dispatcher knows of pools (built before it, handed to it at construction in sidecar/app.py):
    each pool's live instances (:meth:`live`), the pools that take no new run (:meth:`closed`: pool -> why) and
    why a pool run waits (:meth:`waiting_reason`): the dispatcher's ``PoolsView`` (sidecar/pool_table.py).
    :meth:`refresh` recomputes them from the table."""

    def __init__(self, table: WorkerTable) -> None:
        self.table = table
        self.store = table.store
        SCHEMA.ensure(self.store)
        for row in self.store.query("SELECT name, pool FROM pool_instances"):
            st = table.workers.get(row["name"])
            if st is not None:
                st.pool, st.one_shot = row["pool"], True
        self._live: dict[str, list[str]] = {}
        self._closed: dict[str, str] = {}
        self._comfyui: dict[str, str] = {}
        self.slurm: Any = None  # SlurmPools (server/slurm/manager.py), once attached
        self.refresh()

    def attach_slurm(self, slurm: Any) -> None:
        """The Slurm pools' manager: it submits jobs whose agents join, and says why their runs wait."""
        self.slurm = slurm

    def rows(self) -> list[Any]:
        """Every pool's row, by name."""
        return self.store.query("SELECT * FROM worker_pools ORDER BY name")

    def refresh(self) -> None:
        """Each pool's live instances, and which pools take no new run."""
        live: dict[str, list[str]] = {}
        closed: dict[str, str] = {}
        for row in self.rows():
            live[row["name"]] = [st.name for st in self.table.instances(row["name"]) if st.online]
            if row["revoked_at"] is not None:
                closed[row["name"]] = (f"pool {row['name']!r}: its credential was revoked, so no instance can join; "
                                       f"get a new one (xpufleet pools reissue {row['name']})")
        self._live, self._closed = live, closed
        self._comfyui = {r["pool"]: r["path"] for r in self.store.query("SELECT pool, path FROM pool_comfyui")}

    def live(self) -> dict[str, list[str]]:
        """Pool name -> the names of its live instances."""
        return self._live

    def comfyui(self) -> dict[str, str]:
        """The pools whose instances run ComfyUI workflows -> the ComfyUI folder their agents start with."""
        return self._comfyui

    def closed(self) -> dict[str, str]:
        """Pool name -> why it takes no new run."""
        return self._closed

    def waiting_reason(self, pool: str, run_id: str | None = None) -> str | None:
        """Why a pool run waits (None: the plan's own text says it better)."""
        live = [st for st in self.table.instances(pool) if st.online]
        if any(st.taken is None for st in live):
            return None
        slurm = self.slurm.reason(pool, run_id) if self.slurm is not None else None
        if slurm is not None:
            return slurm
        revoked = self.store.query("SELECT 1 FROM worker_pools WHERE name=? AND revoked_at IS NOT NULL", (pool,))
        more = (f"; the pool's credential is revoked (xpufleet pools reissue {pool})" if revoked
                else "; another instance joins with `xpufleet agent start --one-shot --join <the pool's credential>`")
        if not live:
            return f"waiting for an instance of pool {pool} to join{more}"
        return f"waiting for an idle instance of pool {pool} ({len(live)} connected, each has taken its run){more}"


class PoolManagement:
    """One-shot pools: their credentials, instances joining and leaving, their Workers panel rows."""

    def __init__(self, ctx: PartContext, directory: PoolDirectory, describe: Callable[[str, Any], dict[str, Any]],
                 slot_state: Callable[[], Any]) -> None:
        """``ctx``: the table, the dispatcher (runs failed, providers changed), the links;
        ``describe``/``slot_state``: the Workers panel's (status.py)."""
        self.ctx = ctx
        self.directory = directory
        self.describe = describe
        self.slot_state = slot_state

    @property
    def slurm(self) -> Any:
        """The Slurm pools' manager (server/slurm/manager.py), or None; the directory holds it."""
        return self.directory.slurm

    def _pool_row(self, name: str) -> Any:
        rows = self.ctx.store.query("SELECT * FROM worker_pools WHERE name=?", (name,))
        if not rows:
            raise WorkerError(f"no pool named {name!r} (see GET /api/pools)", 404)
        return rows[0]

    def sync(self) -> None:
        """The pools changed: the directory is recomputed and the dispatcher resolves its runs again."""
        self.directory.refresh()
        self.ctx.runs.providers_changed()

    # --- credential -----------------------------------------------------------------------------------
    def _command(self, token: str, server_url: str | None, comfyui: str | None = None) -> str:
        url = server_url or self.ctx.links.server_url() or "http://SERVER:PORT"
        fingerprint = self.ctx.links.tls_fingerprint()
        pin = f" --fingerprint {fingerprint}" if fingerprint and url.startswith("https://") else ""
        comfy = f" --comfyui {shlex.quote(comfyui)}" if comfyui else ""
        return f"xpufleet agent start --one-shot --server {url}{pin}{comfy} --join {token}"

    def create_pool(self, name: Any, server_url: str | None = None, slurm: Any = None,
                    comfyui: str | None = None) -> dict[str, Any]:
        """A new pool and its shared credential (shown once); with ``slurm`` (settings, see
        server/slurm/spec.py) the sidecar submits Slurm jobs whose agents join it. ``comfyui``: the ComfyUI
        folder on the instances' machines: the pool takes ComfyUI runs, its join command says
        ``--comfyui PATH``, and each instance's ComfyUI is checked as it joins."""
        if comfyui is not None and (not isinstance(comfyui, str) or not comfyui.strip()
                                    or any(ord(c) < 32 for c in comfyui)):
            raise WorkerError("comfyui must be the ComfyUI folder on the pool's machines (a path), or absent")
        spec = None
        if slurm is not None:
            if self.slurm is None:
                raise WorkerError("slurm pools are not available on this server")
            try:
                spec = parse_spec(slurm)
            except SpecError as exc:
                raise WorkerError(str(exc)) from None
        if not isinstance(name, str) or protocol.worker_name_problem(name):
            raise WorkerError(f"invalid pool name {name!r}: letters, digits, '.', '_', '-' (up to 64, starting "
                              f"with a letter or digit), not 'local' or 'any'")
        if self.ctx.store.query("SELECT 1 FROM worker_pools WHERE name=?", (name,)):
            raise WorkerError(f"a pool named {name!r} exists already (xpufleet pools reissue {name} gives it a new "
                              f"credential)", 409)
        token = new_secret(protocol.POOL_SECRET_PREFIX)
        with self.ctx.store.transaction() as db:
            db.execute("INSERT INTO worker_pools(name, credential_hash, created_at) VALUES (?,?,?)",
                       (name, hash_secret(token), time.time()))
            if spec is not None:
                self.slurm.insert(db, name, spec)
            if comfyui is not None:
                db.execute("INSERT OR REPLACE INTO pool_comfyui(pool, path) VALUES (?,?)", (name, comfyui))
        if spec is not None:
            self.slurm.set_credential(name, spec, token)
        self.sync()
        return {"name": name, "credential": token, "command": self._command(token, server_url, comfyui)}

    def reissue_pool(self, name: str, server_url: str | None = None) -> dict[str, Any]:
        """A new credential for the pool (the old one stops working; live instances go on)."""
        self._pool_row(name)
        token = new_secret(protocol.POOL_SECRET_PREFIX)
        with self.ctx.store.transaction() as db:
            db.execute("UPDATE worker_pools SET credential_hash=?, revoked_at=NULL WHERE name=?",
                       (hash_secret(token), name))
        entry = self._slurm_pools().get(name)
        if entry is not None:  # its jobs read the credential from the pool's file
            self.slurm.set_credential(name, entry[0], token)
        self.sync()
        return {"name": name, "credential": token,
                "command": self._command(token, server_url, self.directory.comfyui().get(name))}

    def revoke_pool(self, name: str) -> dict[str, Any]:
        """The pool's credential stops working: no new instance joins (runs on instances go on)."""
        self._pool_row(name)
        with self.ctx.store.transaction() as db:
            db.execute("UPDATE worker_pools SET credential_hash=NULL, revoked_at=? WHERE name=?", (time.time(), name))
        self.sync()
        return self.describe_pool(name)

    def export_pool(self, name: str, body: dict[str, Any], server_url: str | None = None) -> dict[str, Any]:
        """Kubernetes manifests whose pods join the pool (server/workers/k8s.py). The credential is the
        one given (checked), a Slurm pool's own, or else a new one (reissued: the old one stops working
        for new instances; live instances go on)."""
        self._pool_row(name)
        fmt = body.get("format", "k8s")
        if fmt != "k8s":
            raise WorkerError(f"format {fmt!r} is not supported: only k8s (Kubernetes manifests)")
        known = {"format", "image", "namespace", "gpus", "instances", "python", "node_selector", "server_url",
                 "credential"}
        unknown = sorted(set(body) - known)
        if unknown:
            raise WorkerError(f"unknown field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        url = body.get("server_url") or server_url or self.ctx.links.server_url() or ""
        opts = {k: body[k] for k in ("image", "namespace", "gpus", "instances", "python", "node_selector") if k in body}
        try:
            ex = k8s.K8sExport(pool=name, server_url=str(url), fingerprint=self.ctx.links.tls_fingerprint(),
                               comfyui=self.directory.comfyui().get(name), **opts)
            k8s.check_export(ex)
        except (k8s.ExportError, TypeError, AttributeError) as exc:
            raise WorkerError(str(exc)) from None
        token, reissued = body.get("credential"), False
        if token is not None:
            if not isinstance(token, str) or self.admit_pool(token, "")[0] != name:
                raise WorkerError(f"credential is not pool {name}'s current credential")
        else:
            entry = self._slurm_pools().get(name)
            token = self.slurm.credential(name, entry[0]) if entry is not None else None
            if token is None:
                token, reissued = self.reissue_pool(name, server_url)["credential"], True
        return {"name": name, "format": "k8s", "reissued": reissued, "manifests": k8s.to_yaml(k8s.manifests(ex, token))}

    async def remove_pool(self, name: str) -> dict[str, Any]:
        """Delete the pool: revoke its credential, fail the runs waiting for it, let idle instances go."""
        self._pool_row(name)
        failed = []
        for row in self.ctx.store.query("SELECT id FROM runs WHERE status='queued' AND target=? ORDER BY seq",
                                        (f"pool:{name}",)):
            self.ctx.runs.run_ended(row["id"], "failed", f"pool {name} was removed while this run waited for it")
            failed.append(row["id"])
        if self.slurm is not None:
            await self.slurm.remove(name)
        with self.ctx.store.transaction() as db:
            db.execute("DELETE FROM worker_pools WHERE name=?", (name,))
            db.execute("DELETE FROM pool_comfyui WHERE pool=?", (name,))
        for st in self.ctx.table.instances(name):
            if not self.ctx.table.active_runs(st.name):
                await self.dismiss(st, f"pool {name} was removed from the server")
        self.sync()
        return {"removed": name, "failed_runs": failed}

    async def dismiss(self, st: WorkerState, reason: str) -> None:
        """Tell an idle instance to leave (it stops) and forget it."""
        conn, st.conn = st.conn, None
        self.depart(st)
        if conn is not None:
            await conn.send("reject", reason=reason, removed=True)
            with contextlib.suppress(Exception):
                await conn.ws.close(code=4410, message=b"removed")

    def admit_pool(self, token: str, name: str) -> tuple[str | None, str | None]:
        """``(pool, None)`` for a valid pool credential, else ``(None, reason)``."""
        rows = self.ctx.store.query("SELECT name, revoked_at FROM worker_pools WHERE credential_hash=?",
                                    (hash_secret(token),))
        if not rows:
            revoked = self.ctx.store.query("SELECT name FROM worker_pools WHERE revoked_at IS NOT NULL")
            hint = " (a pool's credential was revoked or reissued)" if revoked else ""
            return None, (f"unknown or revoked pool credential{hint}: ask for the pool's current one "
                          f"(xpufleet pools reissue NAME)")
        pool = rows[0]["name"]
        st = self.ctx.workers.get(name)
        if st is not None and st.pool != pool:
            return None, (f"worker name {name!r} is taken by another worker: start the one-shot agent without "
                          f"--name (it picks a unique one) or with another name")
        return pool, None

    # --- instances --------------------------------------------------------------------------------------
    def joined(self, st: WorkerState, pool: str) -> None:
        """An instance joined ``pool`` with its credential: remembered (and told to its Slurm pool)."""
        st.pool, st.one_shot = pool, True
        with self.ctx.store.transaction() as db:
            db.execute("INSERT INTO pool_instances(name, pool, joined_at) VALUES (?,?,?)"
                       " ON CONFLICT(name) DO UPDATE SET pool=excluded.pool", (st.name, pool, time.time()))
        if self.slurm is not None:
            self.slurm.instance_joined(st.name, pool)

    def _slurm_pools(self) -> dict[str, Any]:
        return self.slurm.pools() if self.slurm is not None else {}

    def maybe_depart(self, st: WorkerState) -> bool:
        """A one-shot worker that is gone and holds no run has left: forget it (True when it did)."""
        if not st.one_shot or st.online or self.ctx.table.active_runs(st.name):
            return False
        if st.pool is None and st.taken is None:
            return False  # a lone one-shot worker that never took its run may come back
        self.depart(st)
        return True

    def depart(self, st: WorkerState) -> None:
        """Forget a worker that has left (its rows, its provider); its pool's live instances change."""
        if st.grace_handle is not None:
            st.grace_handle.cancel()
            st.grace_handle = None
        with self.ctx.store.transaction() as db:
            db.execute("DELETE FROM pool_instances WHERE name=?", (st.name,))
            db.execute("DELETE FROM workers WHERE name=?", (st.name,))
            db.execute("DELETE FROM worker_device_modes WHERE worker=?", (st.name,))
        if self.ctx.workers.get(st.name) is st:
            self.ctx.workers.pop(st.name, None)
            if st.provider is not None:
                self.ctx.runs.unregister_provider(st.name)
        if st.pool is not None:
            self.sync()

    # --- the Workers data ---------------------------------------------------------------------------------
    def describe_pool(self, name: str, state: Any = None) -> dict[str, Any]:
        """One pool as ``GET /api/pools`` lists it (its instances with their states, its waiting runs)."""
        row = self._pool_row(name)
        instances = [self.describe(st.name, state) for st in self.ctx.table.instances(name)]
        for i in instances:
            i["instance_state"] = instance_state(i)
        queued = self.ctx.store.query("SELECT COUNT(*) AS n FROM runs WHERE status='queued' AND target=?",
                                      (f"pool:{name}",))[0]["n"]
        slurm = self.slurm.describe(name) if self.slurm is not None else None
        return {
            "name": name,
            "kind": "slurm" if slurm else "manual",
            "slurm": (slurm or {}).get("slurm"),
            "jobs": (slurm or {}).get("jobs", []),
            "created_at": row["created_at"],
            "revoked": row["revoked_at"] is not None,
            "instances": instances,
            "idle": sum(1 for i in instances if i["connected"] and not i["one_shot_taken"]),
            "busy": sum(1 for i in instances if i["one_shot_taken"]),
            "queued": int(queued),
            "comfyui": self.directory.comfyui().get(name),  # its agents' ComfyUI folder: it takes ComfyUI runs
            "waiting": waiting_runs(self.ctx.store, name),  # the first WAITING_SHOWN, with their reasons
        }

    def list_pools(self) -> list[dict[str, Any]]:
        """Every pool, by name."""
        state = self.slot_state()
        return [self.describe_pool(r["name"], state) for r in self.directory.rows()]
