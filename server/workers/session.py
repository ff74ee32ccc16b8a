"""One agent's WebSocket session on the sidecar: hello and authentication, welcome, heartbeats,
events, reconciliation of the runs both sides hold, and the end of the connection."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import time
from typing import Any

from ...constants import AGENT_HELLO_TIMEOUT_S, AGENT_PROTOCOL, TERMINAL_STATUSES, VERSION
from ..sidecar.auth import new_secret
from . import protocol
from .provider import WorkerProvider
from .records import hash_secret, secret_matches
from .state import REJECTIONS_KEPT, WorkerState

log = logging.getLogger("xpufleet.workers")


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




class AgentSessions:
    """The connection part of :class:`~.registry.WorkerRegistry` (mixed in)."""

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
                elif msg["type"] in self.message_handlers:  # inference unit instances (server/units)
                    try:
                        await self.message_handlers[msg["type"]](st.name, msg)
                    except Exception:  # noqa: BLE001 - one bad handler must not drop the agent
                        log.exception("worker %s: handling %s failed", st.name, msg["type"])
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
        for listener in self.connection_listeners:
            listener(st.name, False)

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
