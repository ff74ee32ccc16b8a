"""The sidecar's side of worker agents (SPEC Q3-Q5, W1-W6).

* :class:`WorkerRegistry` keeps every known worker (SQLite tables registered through
  :meth:`Store.ensure_schema`, plus the live connection), authenticates agents (session token on the
  same machine, a per-worker credential for remote workers, one-time join tokens exchanged for that
  credential; only hashes are stored), records rejected connections with their reason, and serves one
  agent WebSocket at a time per worker (:meth:`WorkerRegistry.serve`).
* :class:`WorkerProvider` is a worker as the dispatcher sees it (the Provider protocol): its devices
  (with UUIDs, so one physical card offered by several providers is one slot), online/draining, and
  ``start_run`` / ``cancel`` sent over the WebSocket. A worker becomes a provider the first time it
  connects after the server started (SPEC Q3); while offline it stays one, so its runs wait.
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
import hashlib
import hmac
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..constants import (
    AGENT_HELLO_TIMEOUT_S,
    AGENT_PROTOCOL,
    JOIN_TOKEN_TTL_S,
    LOCAL_PROVIDER,
    TERMINAL_STATUSES,
    VERSION,
)
from . import protocol
from .auth import new_secret
from .slots import DeviceOffer, build_state

log = logging.getLogger("xpufleet.workers")

SCHEMA_NAME = "workers"
SCHEMA_VERSION = 1
SCHEMA = """
CREATE TABLE IF NOT EXISTS workers (
    name TEXT PRIMARY KEY,
    auth TEXT NOT NULL,
    credential_hash TEXT,
    drained INTEGER NOT NULL DEFAULT 0,
    version TEXT,
    env TEXT NOT NULL DEFAULT '{}',
    node_types TEXT NOT NULL DEFAULT '[]',
    devices TEXT NOT NULL DEFAULT '[]',
    created_at REAL NOT NULL,
    last_seen REAL,
    last_connected REAL
);
CREATE TABLE IF NOT EXISTS worker_join_tokens (
    token_hash TEXT PRIMARY KEY,
    name TEXT,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    used_at REAL,
    used_by TEXT
);
CREATE TABLE IF NOT EXISTS worker_rejections (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    name TEXT,
    address TEXT,
    version TEXT,
    reason TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS worker_rejections_name ON worker_rejections(name, id);
CREATE TABLE IF NOT EXISTS worker_device_modes (
    worker TEXT NOT NULL,
    device TEXT NOT NULL,
    mode TEXT NOT NULL,
    updated_at REAL NOT NULL,
    PRIMARY KEY (worker, device)
);
"""

WORKER_NAME_RE = protocol.WORKER_NAME_RE
RESERVED_NAMES = protocol.RESERVED_NAMES
MODES = ("exclusive", "shared")
SHAREABLE_KINDS = ("cuda", "mps")  # seed 000: only CUDA and MPS cards, only on workers
REJECTIONS_KEPT = 200


class WorkerError(Exception):
    """A management request that cannot apply; ``status`` is the HTTP code, the text what to fix."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


def hash_secret(secret: str) -> str:
    """What the database keeps of a credential or join token (SHA-256, hex)."""
    return hashlib.sha256(secret.encode("utf-8", "surrogatepass")).hexdigest()


def secret_matches(given: str, stored_hash: str | None) -> bool:
    """Constant-time comparison of a presented secret with a stored hash."""
    if not stored_hash:
        return False
    return hmac.compare_digest(hash_secret(given), stored_hash)


def node_type_diff(server_types: list[str] | set[str], worker_types: list[str] | set[str]) -> dict[str, Any]:
    """Which node types the worker lacks and which only it has (pure)."""
    s, w = set(server_types), set(worker_types)
    missing, extra = sorted(s - w), sorted(w - s)
    return {"match": not missing and not extra, "missing_on_worker": missing, "only_on_worker": extra}


def _names(items: list[str], n: int = 5) -> str:
    return ", ".join(items[:n]) + (f" and {len(items) - n} more" if len(items) > n else "")


def worker_status(
    *, connected: bool, drained: bool, heartbeat_age_s: float | None, late_after_s: float,
    node_types: dict[str, Any] | None, disconnected_for_s: float | None = None,
    ever_connected: bool = True, runs_in_grace: int = 0, grace_s: float = 0.0,
) -> tuple[str, str]:
    """Online / Degraded / Draining / Disconnected and the reason shown beside it (pure)."""
    if not connected:
        if not ever_connected:
            return "Disconnected", "has not connected since the server started"
        why = "disconnected" + (f" {disconnected_for_s:.0f} s ago" if disconnected_for_s is not None else "")
        if runs_in_grace:
            left = max(0.0, grace_s - (disconnected_for_s or 0.0))
            why += f"; its {runs_in_grace} run(s) keep running for up to {left:.0f} s more"
        return "Disconnected", why + ("; draining" if drained else "")
    if drained:
        return "Draining", "draining: no new runs; running runs finish"
    reasons = []
    if heartbeat_age_s is not None and heartbeat_age_s > late_after_s:
        reasons.append(f"late heartbeat: none for {heartbeat_age_s:.0f} s")
    if node_types is not None and not node_types["match"]:
        parts = []
        if node_types["missing_on_worker"]:
            parts.append(f"missing on the worker: {_names(node_types['missing_on_worker'])}")
        if node_types["only_on_worker"]:
            parts.append(f"only on the worker: {_names(node_types['only_on_worker'])}")
        reasons.append("node types differ from the server's (" + "; ".join(parts) + ")")
    if reasons:
        return "Degraded", "; ".join(reasons)
    return "Online", ""


# --- live state ------------------------------------------------------------------------------------

class Connection:
    """One agent WebSocket (aiohttp ``WebSocketResponse``)."""

    def __init__(self, ws: Any, name: str, peer: str | None) -> None:
        self.ws = ws
        self.name = name
        self.peer = peer
        self.lock = asyncio.Lock()
        self.opened = time.time()

    @property
    def closed(self) -> bool:
        return bool(self.ws.closed)

    async def send(self, mtype: str, **fields: Any) -> bool:
        """Send one message; False when the socket is gone (the caller decides what that means)."""
        if self.closed:
            return False
        try:
            text = protocol.encode(mtype, **fields)
            async with self.lock:
                await self.ws.send_str(text)
            return True
        except (ConnectionError, RuntimeError, OSError) as exc:
            log.info("worker %s: send %s failed: %s", self.name, mtype, exc)
            return False


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

    @property
    def online(self) -> bool:
        return self.conn is not None and not self.conn.closed


class WorkerProvider:
    """A worker as the dispatcher sees it (SPEC Q3-Q5): devices with UUIDs, start and cancel."""

    is_local = False

    def __init__(self, registry: WorkerRegistry, name: str) -> None:
        self.registry = registry
        self.name = name

    @property
    def _state(self) -> WorkerState | None:
        return self.registry.workers.get(self.name)

    @property
    def online(self) -> bool:
        st = self._state
        return st is not None and st.online

    @property
    def draining(self) -> bool:
        st = self._state
        return st is None or st.drained

    def devices(self) -> list[DeviceOffer]:
        st = self._state
        if st is None:
            return []
        return [DeviceOffer(name=str(d["name"]), kind=str(d["kind"]), uuid=d.get("uuid") or None,
                            total_gib=d.get("total_gib")) for d in st.devices]

    async def start_run(self, run: dict[str, Any], devices: list[str]) -> None:
        """Send ``start_run``; the agent's events then arrive through the registry."""
        st = self._state
        if st is None or st.conn is None:
            raise RuntimeError(f"worker {self.name} disconnected before the run could be sent to it")
        if not await self.registry.send_start(st.conn, run, devices):
            raise RuntimeError(f"worker {self.name} disconnected before the run could be sent to it")

    async def cancel(self, run_id: str) -> bool:
        """Ask the agent to stop the run (sent again after a reconnect if it is offline now)."""
        st = self._state
        if st is None or st.conn is None:
            return False
        return await st.conn.send("cancel_run", run_id=run_id, reason="cancelled by request")


# --- the registry ------------------------------------------------------------------------------------

class WorkerRegistry:
    """Workers, their connections and their runs (one per sidecar; lives on the event loop)."""

    def __init__(
        self,
        store: Any,
        dispatcher: Any,
        session_token: Callable[[], str | None] | str | None,
        server_node_types: Callable[[], list[str]] | None = None,
        server_url: Callable[[], str | None] | str | None = None,
    ) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self._session_token = session_token
        self._server_node_types = server_node_types or _default_node_types
        self._server_url = server_url
        self.workers: dict[str, WorkerState] = {}
        self.started_at = time.monotonic()
        self._grace_started = False
        self._announced_warnings: set[str] = set()
        store.ensure_schema(SCHEMA_NAME, SCHEMA, SCHEMA_VERSION)
        for row in store.query("SELECT * FROM workers ORDER BY name"):
            self.workers[row["name"]] = WorkerState(
                name=row["name"], auth=row["auth"], drained=bool(row["drained"]), version=row["version"],
                env=json.loads(row["env"]), node_types=json.loads(row["node_types"]),
                devices=json.loads(row["devices"]), created_at=row["created_at"], last_seen=row["last_seen"],
            )

    # --- small helpers ------------------------------------------------------------------------------
    def session_token(self) -> str | None:
        tok = self._session_token
        return tok() if callable(tok) else tok

    def server_url(self) -> str | None:
        url = self._server_url
        return url() if callable(url) else url

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

    # --- authentication -------------------------------------------------------------------------------
    def record_rejection(self, name: str | None, address: str | None, version: str | None, reason: str) -> None:
        """Remember a refused connection (shown under "Rejected connections")."""
        log.warning("refused agent %s from %s: %s", name or "?", address or "?", reason)
        with self.store.transaction() as db:
            # An agent that keeps retrying (every <= 10 s) shows once, at its latest attempt, and
            # cannot push other refusals out of the kept list.
            db.execute("DELETE FROM worker_rejections WHERE name IS ? AND address IS ? AND version IS ? AND reason=?",
                       (name, address, version, reason))
            db.execute("INSERT INTO worker_rejections(ts, name, address, version, reason) VALUES (?,?,?,?,?)",
                       (time.time(), name, address, version, reason))
            db.execute("DELETE FROM worker_rejections WHERE id <= (SELECT MAX(id) FROM worker_rejections) - ?",
                       (REJECTIONS_KEPT,))

    def rejections(self, limit: int = 50) -> list[dict[str, Any]]:
        rows = self.store.query(
            "SELECT ts, name, address, version, reason FROM worker_rejections ORDER BY id DESC LIMIT ?", (limit,))
        now = time.time()
        return [{**dict(r), "age_s": round(now - r["ts"], 1)} for r in rows]

    def _last_rejection(self, name: str) -> dict[str, Any] | None:
        rows = self.store.query(
            "SELECT ts, address, version, reason FROM worker_rejections WHERE name=? ORDER BY id DESC LIMIT 1",
            (name,))
        return dict(rows[0]) if rows else None

    def authenticate(self, hello: dict[str, Any]) -> tuple[str | None, str | None, str | None]:
        """Check a hello: ``(reason_to_refuse, join_token_hash_to_consume, new_credential)``."""
        name = hello["name"]
        if hello["protocol"] != AGENT_PROTOCOL:
            return (f"protocol mismatch: the agent speaks protocol {hello['protocol']}, the server "
                    f"{AGENT_PROTOCOL}; install the same xpufleet version on both machines"), None, None
        bad_name = protocol.worker_name_problem(name)
        if bad_name:
            return bad_name, None, None
        auth = hello["auth"]
        kind, token = auth["kind"], auth["token"]
        join_hash = None
        credential = None
        if kind == "session":
            expected = self.session_token()
            if not expected or not hmac.compare_digest(token.encode("utf-8", "surrogatepass"),
                                                       expected.encode("utf-8", "surrogatepass")):
                return ("wrong session token: a same-machine agent reads it from the running server's "
                        "runtime.json; a remote worker joins with --join TOKEN"), None, None
        elif kind == "credential":
            rows = self.store.query("SELECT credential_hash FROM workers WHERE name=?", (name,))
            if not rows or not rows[0]["credential_hash"]:
                return (f"no credential is valid for worker {name!r} (it was removed, or never joined): "
                        f"join again with a new token (POST /api/workers/join-tokens)"), None, None
            if not secret_matches(token, rows[0]["credential_hash"]):
                return (f"bad credential for worker {name!r} (revoked or reissued): join again with a new "
                        f"token"), None, None
        else:  # join
            rows = self.store.query("SELECT * FROM worker_join_tokens WHERE token_hash=?", (hash_secret(token),))
            row = rows[0] if rows else None
            if row is None:
                return "unknown join token: ask the server for a new one (POST /api/workers/join-tokens)", None, None
            if row["used_at"] is not None:
                return "this join token was already used (tokens are one-time): ask for a new one", None, None
            if row["expires_at"] < time.time():
                return "this join token has expired: ask for a new one", None, None
            if row["name"] and row["name"] != name:
                return (f"this join token is for worker {row['name']!r}, not {name!r}: start the agent with "
                        f"--name {row['name']}"), None, None
            join_hash = row["token_hash"]
            credential = new_secret("xfc")
        if hello["version"] != VERSION:
            return (f"version mismatch: the agent runs xpufleet {hello['version']}, the server {VERSION}; "
                    f"install the same version on both machines"), None, None
        return None, join_hash, credential

    # --- the connection ------------------------------------------------------------------------------
    async def serve(self, ws: Any, peer: str | None) -> None:
        """Serve one agent WebSocket (already prepared) until it closes."""
        import aiohttp

        try:
            first = await asyncio.wait_for(ws.receive(), timeout=AGENT_HELLO_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.record_rejection(None, peer, None, f"no hello within {AGENT_HELLO_TIMEOUT_S:g} s")
            await ws.close(code=4400, message=b"no hello")
            return
        if first.type != aiohttp.WSMsgType.TEXT:
            return
        try:
            hello = protocol.decode(first.data, protocol.AGENT_TO_SIDECAR)
            if hello["type"] != "hello":
                raise protocol.ProtocolError(f"the first message must be hello, not {hello['type']}")
        except protocol.ProtocolError as exc:
            name = _peek_name(first.data)
            self.record_rejection(name, peer, None, f"bad hello: {exc}")
            with contextlib.suppress(Exception):
                await ws.send_str(json.dumps({"type": "reject", "reason": f"bad hello: {exc}"}))
            await ws.close(code=4400, message=b"bad hello")
            return
        reason, join_hash, credential = self.authenticate(hello)
        if reason is not None:
            self.record_rejection(hello["name"], peer, hello.get("version"), reason)
            with contextlib.suppress(Exception):
                await ws.send_str(protocol.encode("reject", reason=reason))
            await ws.close(code=4403, message=b"refused")
            return
        conn = Connection(ws, hello["name"], peer)
        st = await self._attach(conn, hello, join_hash, credential)
        try:
            async for frame in ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    break
                try:
                    msg = protocol.decode(frame.data, protocol.AGENT_TO_SIDECAR)
                except protocol.ProtocolError as exc:
                    log.warning("worker %s: ignoring a bad message: %s", st.name, exc)
                    continue
                st.last_seen = time.time()
                if msg["type"] == "heartbeat":
                    await self._on_heartbeat(st, conn, msg)
                elif msg["type"] == "event":
                    await self._on_event(st, conn, msg)
        finally:
            self._detach(st, conn)

    async def _attach(self, conn: Connection, hello: dict[str, Any], join_hash: str | None,
                      credential: str | None) -> WorkerState:
        name = hello["name"]
        now = time.time()
        st = self.workers.get(name)
        if st is None:
            st = self.workers[name] = WorkerState(name=name, created_at=now)
        if credential is not None:
            st.auth = "credential"
        elif hello["auth"]["kind"] == "session" and st.auth != "credential":
            st.auth = "session"
        st.version = hello["version"]
        st.env = dict(hello.get("env") or {})
        st.node_types = list(hello["node_types"])
        st.devices = _clean_devices(hello["devices"])
        st.last_seen = now
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO workers(name, auth, credential_hash, drained, version, env, node_types, devices,"
                " created_at, last_seen, last_connected) VALUES (?,?,?,?,?,?,?,?,?,?,?)"
                " ON CONFLICT(name) DO UPDATE SET auth=excluded.auth,"
                " credential_hash=COALESCE(?, workers.credential_hash), version=excluded.version,"
                " env=excluded.env, node_types=excluded.node_types, devices=excluded.devices,"
                " last_seen=excluded.last_seen, last_connected=excluded.last_connected",
                (name, st.auth, hash_secret(credential) if credential else None, int(st.drained), st.version,
                 json.dumps(st.env), json.dumps(st.node_types), json.dumps(st.devices), st.created_at, now, now,
                 hash_secret(credential) if credential else None),
            )
            if join_hash is not None:
                db.execute("UPDATE worker_join_tokens SET used_at=?, used_by=? WHERE token_hash=?",
                           (now, name, join_hash))
        old = st.conn
        st.conn = conn
        st.connected_since_start = True
        st.last_heartbeat = time.monotonic()
        st.disconnected_at = None
        if st.grace_handle is not None:
            st.grace_handle.cancel()
            st.grace_handle = None
        if old is not None and not old.closed:
            log.info("worker %s: a new connection replaces the old one", name)
            with contextlib.suppress(Exception):
                await old.ws.close(code=4409, message=b"replaced by a new connection")
        active = {r["id"]: r for r in self._active_runs(name)}
        known = {rid: self.store.last_source_seq(rid) for rid in active}
        await conn.send("welcome", name=name, server_version=VERSION, runs=known, credential=credential,
                        heartbeat_interval_s=protocol.heartbeat_interval_s(),
                        resume_grace_s=protocol.resume_grace_s())
        log.info("worker %s connected from %s (%d device(s), %d run(s) to take over)",
                 name, conn.peer, len(st.devices), len(known))
        if st.provider is None:
            st.provider = WorkerProvider(self, name)
            self.dispatcher.register_provider(st.provider)
        else:
            self.dispatcher.providers_changed()
        await self._reconcile(st, conn, hello, active)
        self._log_limit_warnings(name)
        return st

    async def _reconcile(self, st: WorkerState, conn: Connection, hello: dict[str, Any],
                         active: dict[str, dict[str, Any]]) -> None:
        """Runs the server expects on this worker vs the runs the agent says it holds."""
        held = {r["run_id"] for r in hello.get("runs") or []}
        for run_id, run in active.items():
            if run_id in held:
                if run.get("cancel_requested"):
                    await conn.send("cancel_run", run_id=run_id, reason="cancelled while the worker was away")
                continue
            if run["status"] == "assigned" and self.store.last_source_seq(run_id) == 0:
                full = self.store.get_run(run_id, with_graph=True)
                if full is not None:  # sent before the connection broke, never received: send again
                    await self.send_start(conn, full, list(run["devices"]))
                continue
            self.dispatcher.run_ended(
                run_id, "interrupted",
                f"worker {st.name} reconnected without this run (its agent was restarted); the run was interrupted",
            )

    def _detach(self, st: WorkerState, conn: Connection) -> None:
        if st.conn is not conn:
            return  # replaced by a newer connection
        st.conn = None
        st.disconnected_at = time.monotonic()
        with contextlib.suppress(Exception):
            with self.store.transaction() as db:
                db.execute("UPDATE workers SET last_seen=? WHERE name=?", (st.last_seen, st.name))
        if self.workers.get(st.name) is st and self._active_runs(st.name):
            self._schedule_grace(st)
        log.info("worker %s disconnected", st.name)
        self.dispatcher.providers_changed()

    async def send_start(self, conn: Connection, run: dict[str, Any], devices: list[str]) -> bool:
        """Send one run to an agent."""
        return await conn.send(
            "start_run", run_id=run["id"], graph=run["graph"], options=run.get("options") or {},
            devices=list(devices), budget_gib=run.get("budget_gib"),
        )

    async def _on_heartbeat(self, st: WorkerState, conn: Connection, msg: dict[str, Any]) -> None:
        st.last_heartbeat = time.monotonic()
        devices = _clean_devices(msg["devices"])
        changed = _offer_key(devices) != _offer_key(st.devices)
        st.devices = devices
        with self.store.transaction() as db:
            db.execute("UPDATE workers SET devices=?, last_seen=? WHERE name=?",
                       (json.dumps(devices), st.last_seen, st.name))
        if changed:
            self.dispatcher.providers_changed()
        for r in msg.get("runs") or []:
            run = self.store.get_run(r["run_id"])
            if run is None or run["worker_id"] != st.name or run["status"] in TERMINAL_STATUSES:
                await conn.send("forget_run", run_id=r["run_id"], reason="the server does not expect this run")
            else:
                await conn.send("ack", run_id=r["run_id"], seq=self.store.last_source_seq(r["run_id"]))

    async def _on_event(self, st: WorkerState, conn: Connection, msg: dict[str, Any]) -> None:
        run_id = msg["run_id"]
        run = self.store.get_run(run_id)
        if run is None or run["worker_id"] != st.name:
            log.warning("worker %s sent an event for run %s, which is not its run; ignored", st.name, run_id)
            await conn.send("forget_run", run_id=run_id, reason="not a run of this worker")
            return
        if run["status"] in TERMINAL_STATUSES:
            await conn.send("forget_run", run_id=run_id, reason=f"the run already ended ({run['status']})")
            return
        if run["status"] == "assigned":
            self.dispatcher.run_process_started(run_id, None)
        self.dispatcher.ingest(run_id, [{"seq": msg["seq"], "type": msg["event_type"],
                                         "payload": msg["payload"], "ts": msg.get("ts")}])
        if msg["event_type"] == "run_finished":
            await conn.send("ack", run_id=run_id, seq=msg["seq"])

    def _log_limit_warnings(self, name: str) -> None:
        """Seed 000: an override lowered by a smaller limit of another provider is logged on connect."""
        for w in self.limit_warnings(name):
            if w not in self._announced_warnings:
                self._announced_warnings.add(w)
                log.warning("slot limits: %s", w)

    # --- slots view -------------------------------------------------------------------------------------
    def _slot_state(self) -> Any:
        holdings = {r["id"]: (r["worker_id"] or LOCAL_PROVIDER, tuple(r["devices"])) for r in self.store.active()}
        return build_state(self.dispatcher.provider_infos(), self.dispatcher.overrides, holdings)

    def limit_warnings(self, name: str | None = None, state: Any = None) -> list[str]:
        """Overrides lowered by another provider of the same card (all, or those naming ``name``)."""
        state = state if state is not None else self._slot_state()
        return [w for w in state.warnings
                if name is None or f" on {name} is lowered" in w or f"offered by {name} with" in w]

    # --- management ---------------------------------------------------------------------------------------
    def _modes(self, name: str) -> dict[str, str]:
        rows = self.store.query("SELECT device, mode FROM worker_device_modes WHERE worker=?", (name,))
        return {r["device"]: r["mode"] for r in rows}

    def set_mode(self, name: str, device: str, mode: Any) -> dict[str, Any]:
        """A card's mode on a worker (exclusive|shared), persisted across reconnects and restarts."""
        st = self.get(name)
        if mode not in MODES:
            raise WorkerError(f"mode must be \"exclusive\" or \"shared\", got {mode!r}")
        dev = next((d for d in st.devices if d["name"] == device), None)
        if dev is None:
            offered = ", ".join(d["name"] for d in st.devices) or "nothing"
            raise WorkerError(f"worker {name} does not offer {device} (it offers {offered})", 404)
        if mode == "shared" and dev["kind"] not in SHAREABLE_KINDS:
            raise WorkerError(f"{device} is a {dev['kind']} device: only CUDA and MPS cards can be shared by memory")
        with self.store.transaction() as db:
            db.execute(
                "INSERT INTO worker_device_modes(worker, device, mode, updated_at) VALUES (?,?,?,?)"
                " ON CONFLICT(worker, device) DO UPDATE SET mode=excluded.mode, updated_at=excluded.updated_at",
                (name, device, mode, time.time()))
        self.dispatcher.providers_changed()
        return {"worker": name, "device": device, "mode": mode}

    def device_mode(self, name: str, device: str) -> str:
        """``exclusive`` (default) or ``shared``."""
        return self._modes(name).get(device, "exclusive")

    def set_drained(self, name: str, drained: bool) -> dict[str, Any]:
        st = self.get(name)
        st.drained = drained
        with self.store.transaction() as db:
            db.execute("UPDATE workers SET drained=? WHERE name=?", (int(drained), name))
        self.dispatcher.providers_changed()
        return self.describe(name)

    async def remove(self, name: str) -> dict[str, Any]:
        """Revoke the worker's credential, disconnect it, fail the runs waiting for it, and forget it."""
        st = self.get(name)
        failed: list[str] = []
        for run in self._queued_for(name):
            self.dispatcher.run_ended(run["id"], "failed", f"worker {name} was removed while this run waited for it")
            failed.append(run["id"])
        interrupted: list[str] = []
        for run in self._active_runs(name):
            if st.conn is not None:
                await st.conn.send("forget_run", run_id=run["id"], reason=f"worker {name} was removed")
            self.dispatcher.run_ended(run["id"], "interrupted", f"worker {name} was removed from the server")
            interrupted.append(run["id"])
        with self.store.transaction() as db:
            db.execute("DELETE FROM workers WHERE name=?", (name,))
            db.execute("DELETE FROM worker_device_modes WHERE worker=?", (name,))
        if st.grace_handle is not None:
            st.grace_handle.cancel()
        self.workers.pop(name, None)
        conn, st.conn = st.conn, None
        if conn is not None:
            await conn.send("reject", reason=f"worker {name} was removed from the server", removed=True)
            with contextlib.suppress(Exception):
                await conn.ws.close(code=4410, message=b"removed")
        if st.provider is not None:
            self.dispatcher.unregister_provider(name)
        return {"removed": name, "failed_runs": failed, "interrupted_runs": interrupted}

    def _queued_for(self, name: str) -> list[dict[str, Any]]:
        rows = self.store.query("SELECT id FROM runs WHERE status='queued' AND target=? ORDER BY seq", (name,))
        return [{"id": r["id"]} for r in rows]

    async def reissue(self, name: str, server_url: str | None = None) -> dict[str, Any]:
        """A new credential for a joined worker; the old one stops working at once.

        A connected worker gets the new credential over its connection (it keeps working); an offline
        one must join again, so a one-time join token for its name comes back too.
        """
        st = self.get(name)
        if st.auth != "credential":
            raise WorkerError(
                f"worker {name} connects with this server's session token (same machine): it has no "
                f"credential to reissue", 409)
        credential = new_secret("xfc")
        with self.store.transaction() as db:
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
        with self.store.transaction() as db:
            db.execute("INSERT INTO worker_join_tokens(token_hash, name, created_at, expires_at) VALUES (?,?,?,?)",
                       (hash_secret(token), name, now, now + ttl))
        url = server_url or self.server_url() or "http://SERVER:PORT"
        cmd = f"xpufleet agent start --server {url} --join {token}" + (f" --name {name}" if name else "")
        return {"join_token": token, "name": name, "expires_at": now + ttl, "command": cmd}

    # --- the Workers panel -----------------------------------------------------------------------------
    def describe(self, name: str, state: Any = None) -> dict[str, Any]:
        """One worker as ``GET /api/workers`` lists it (every field of seed 000's Workers panel)."""
        st = self.get(name)
        state = state if state is not None else self._slot_state()
        now_m = time.monotonic()
        hb_age = None if st.last_heartbeat is None or not st.online else now_m - st.last_heartbeat
        types = node_type_diff(self.server_node_types(), st.node_types) if st.version else None
        active = self._active_runs(name)
        disconnected_for = None if st.disconnected_at is None else now_m - st.disconnected_at
        status, reason = worker_status(
            connected=st.online, drained=st.drained, heartbeat_age_s=hb_age,
            late_after_s=protocol.heartbeat_late_s(), node_types=types if st.online else None,
            disconnected_for_s=disconnected_for, ever_connected=st.connected_since_start,
            runs_in_grace=len(active) if st.grace_handle is not None else 0, grace_s=protocol.resume_grace_s(),
        )
        modes = self._modes(name)
        devices = []
        for d in st.devices:
            slot = state.slot_for(name, d["name"]) if st.provider is not None else None
            same = []
            limit = None
            if slot is not None:
                same = [{"provider": o.provider, "device": o.device} for o in slot.offers if o.provider != name]
                own = next((o.limit for o in slot.offers if o.provider == name), None)
                limit = slot.limit if slot.limit > 0 else own  # offline: its own limit, not 0
            devices.append({
                "name": d["name"], "kind": d["kind"], "label": d.get("label"), "uuid": d.get("uuid"),
                "total_gib": d.get("total_gib"), "free_gib": d.get("free_gib"),
                "simulated": bool(d.get("simulated")),
                "slots_used": slot.used if slot is not None else sum(1 for r in active if d["name"] in r["devices"]),
                "slot_limit": limit,
                "limit_from": slot.limit_from if slot is not None else None,
                "mode": modes.get(d["name"], "exclusive"),
                "same_card_as": same,
                "last_reported": not st.online,
            })
        last_seen_age = None if st.last_seen is None else round(time.time() - st.last_seen, 1)
        return {
            "name": name,
            "status": status,
            "status_reason": reason,
            "connected": st.online,
            "connected_since_start": st.connected_since_start,
            "auth": st.auth,
            "drained": st.drained,
            "version": st.version,
            "server_version": VERSION,
            "version_match": st.version == VERSION if st.version else None,
            "environment": st.env,
            "node_types": types,
            "last_rejection": self._last_rejection(name),
            "heartbeat_age_s": None if hb_age is None else round(hb_age, 1),
            "last_seen_age_s": last_seen_age,
            "simulated": any(d.get("simulated") for d in st.devices),
            "devices": devices,
            "runs": [{"id": r["id"], "name": r["name"], "status": r["status"], "devices": r["devices"]}
                     for r in active],
            "queued": len(self._queued_for(name)),
            "warnings": self.limit_warnings(name, state),
            "peer": st.conn.peer if st.conn is not None else None,
        }

    def list(self) -> list[dict[str, Any]]:
        """Every known worker, by name."""
        state = self._slot_state()
        return [self.describe(n, state) for n in sorted(self.workers)]

    async def close(self) -> None:
        """Server stopping: close agent connections (they reconnect to the next server; runs go on)."""
        for st in self.workers.values():
            if st.grace_handle is not None:
                st.grace_handle.cancel()
                st.grace_handle = None
            conn = st.conn
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.ws.close(code=1001, message=b"server stopping")


def _default_node_types() -> list[str]:
    from ..nodes import NODE_CLASS_MAPPINGS

    return sorted(NODE_CLASS_MAPPINGS)


def _clean_devices(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for d in devices:
        name = str(d["name"])
        if name == "mps":
            name = "mps:0"
        out.append({
            "name": name, "kind": d["kind"], "label": d.get("label"), "uuid": d.get("uuid") or None,
            "total_gib": d.get("total_gib"), "free_gib": d.get("free_gib"), "simulated": bool(d.get("simulated")),
        })
        # the CPU entry's commit charge: the predictor's P_load (S_virt) for this worker's cards
        for key in ("commit_used_gib", "commit_limit_gib"):
            v = d.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[-1][key] = v
    return out


def _offer_key(devices: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(d["name"], d["kind"], d.get("uuid")) for d in devices]


def _peek_name(data: Any) -> str | None:
    try:
        name = json.loads(data).get("name")
    except Exception:  # noqa: BLE001
        return None
    return name[:64] if isinstance(name, str) else None
