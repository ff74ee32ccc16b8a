"""One agent's WebSocket session on the sidecar: hello and authentication, welcome, heartbeats,
events, reconciliation of the runs both sides hold, and the end of the connection."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from ...common.secrets import new_secret
from ...constants import AGENT_HELLO_TIMEOUT_S, AGENT_PROTOCOL, TERMINAL_STATUSES, VERSION
from ..comfyflow.reading import CAPABILITY as COMFYUI_CAPABILITY
from ..comfyflow.reading import STATE_NONE, STATE_PROBING, reading_of
from ..memory.admission import can_cap, cap_refusal
from . import protocol
from .context import PartContext
from .grace import ResumeGrace
from .outputs import OutputsAccess
from .pools import PoolManagement
from .provider import WorkerProvider
from .records import Rejections, hash_secret, secret_matches
from .state import AgentLink, WorkerState

MessageHandler = Callable[[str, dict[str, Any]], Awaitable[None]]
ConnectionListener = Callable[[str, bool], None]

log = logging.getLogger("xpufleet.workers")

# A version string the server repeats in a refusal: anything else is a peer's free text, not quoted.
_VERSION_SHOWN = re.compile(r"[0-9A-Za-z][0-9A-Za-z.+_-]{0,39}")


@dataclass
class Admission:
    """What :meth:`AgentSessions.authenticate` decided about a hello."""

    reason: str | None = None  # why it is refused (None: admitted)
    join_hash: str | None = None  # a one-time join token to mark used
    credential: str | None = None  # a new credential to hand over
    pool: str | None = None  # the pool whose shared credential it presented


class Connection:
    """One agent WebSocket (aiohttp ``WebSocketResponse``)."""

    def __init__(self, ws: Any, name: str, peer: str | None, hello: dict[str, Any] | None = None) -> None:
        self.ws = ws
        self.name = name
        self.peer = peer
        self.identity = agent_identity(hello or {})
        self.lock = asyncio.Lock()
        self.opened = time.time()
        self.pending: dict[str, asyncio.Future[dict[str, Any]]] = {}  # read_outputs requests in flight

    def answer(self, msg: dict[str, Any]) -> None:
        """An ``outputs_data`` reply: hand it to the request waiting for it."""
        fut = self.pending.pop(msg["request_id"], None)
        if fut is not None and not fut.done():
            fut.set_result(msg)

    def fail_pending(self) -> None:
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError(f"worker {self.name} disconnected"))
        self.pending.clear()

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
    """The agents' WebSocket sessions: authentication, attach/detach, and each message's handling."""

    def __init__(self, ctx: PartContext, rejections: Rejections, pools: PoolManagement, outputs: OutputsAccess,
                 grace: ResumeGrace, is_disabled: Callable[[str], bool],
                 limit_warnings: Callable[[str], list[str]]) -> None:
        """``ctx``: the table, the dispatcher (providers, run events back), the links; ``is_disabled``: an SSH
        worker the user disabled; ``limit_warnings``: the slot overrides another provider lowers (logged once
        on connect)."""
        self.ctx = ctx
        self.rejections = rejections
        self.pools = pools
        self.outputs = outputs
        self.grace = grace
        self.is_disabled = is_disabled
        self.limit_warnings = limit_warnings
        self._announced_warnings: set[str] = set()
        # Other parts' agent messages (message type -> handler(worker, msg)) and connection changes
        # (listener(worker, online)): spread runs' parts, inference unit instances (server/units).
        self.message_handlers: dict[str, MessageHandler] = {}
        self.connection_listeners: list[ConnectionListener] = []

    def register_handler(self, mtype: str, handler: MessageHandler) -> None:
        """Another part handles the agent messages of type ``mtype`` (wired once, in sidecar/app.py)."""
        if mtype in self.message_handlers:
            raise ValueError(f"agent message {mtype!r} has a handler already")
        self.message_handlers[mtype] = handler

    def add_connection_listener(self, listener: ConnectionListener) -> None:
        """``listener(worker, online)`` is called when a worker's agent disconnects."""
        self.connection_listeners.append(listener)

    def provider(self, name: str) -> WorkerProvider:
        """A worker as the dispatcher sees it."""
        return WorkerProvider(self.ctx.workers, name, self.is_disabled, self.send_start)

    def authenticate(self, hello: dict[str, Any]) -> Admission:
        """Check a hello: refused with a reason, or admitted (with what to record)."""
        name = hello["name"]
        if hello["protocol"] != AGENT_PROTOCOL:
            return Admission(f"protocol mismatch: the agent speaks protocol {hello['protocol']}, the server "
                             f"{AGENT_PROTOCOL}; install the same xpufleet version on both machines")
        bad_name = protocol.worker_name_problem(name)
        if bad_name:
            return Admission(bad_name)
        auth = hello["auth"]
        kind, token = auth["kind"], auth["token"]
        out = Admission()
        if kind == "session":
            expected = self.ctx.links.session_token()
            if not expected or not hmac.compare_digest(token.encode("utf-8", "surrogatepass"),
                                                       expected.encode("utf-8", "surrogatepass")):
                return Admission("wrong session token: a same-machine agent reads it from the running server's "
                                 "runtime.json; a remote worker joins with --join TOKEN")
        elif kind == "credential":
            rows = self.ctx.store.query("SELECT credential_hash FROM workers WHERE name=?", (name,))
            if not rows or not rows[0]["credential_hash"]:
                return Admission(f"no credential is valid for worker {name!r} (it was removed, or never joined): "
                                 f"join again with a new token (POST /api/workers/join-tokens)")
            if not secret_matches(token, rows[0]["credential_hash"]):
                return Admission(f"bad credential for worker {name!r} (revoked or reissued): join again with a new "
                                 f"token")
        elif kind == "pool":
            pool, why = self.pools.admit_pool(token, name)
            if why is not None:
                return Admission(why)
            if not hello.get("one_shot"):
                return Admission(f"a pool's credential joins one-shot agents only: start the agent with "
                                 f"--one-shot --join ... (pool {pool})")
            out.pool = pool
        else:  # join
            rows = self.ctx.store.query("SELECT * FROM worker_join_tokens WHERE token_hash=?", (hash_secret(token),))
            row = rows[0] if rows else None
            if row is None:
                return Admission("unknown join token: ask the server for a new one (POST /api/workers/join-tokens)")
            if row["used_at"] is not None:
                return Admission("this join token was already used (tokens are one-time): ask for a new one")
            if row["expires_at"] < time.time():
                return Admission("this join token has expired: ask for a new one")
            if row["name"] and row["name"] != name:
                return Admission(f"this join token is for worker {row['name']!r}, not {name!r}: start the agent "
                                 f"with --name {row['name']}")
            if not row["name"] and self.enrolled(name):
                return Admission(
                    f"worker name {name!r} belongs to an enrolled worker, and this join token was not issued for "
                    f"a name: its credential is unchanged. To join this machine as {name!r}, ask for a token "
                    f"for that name (xpufleet workers reissue {name}, or a join token with name {name!r}); "
                    f"else start the agent with another --name")
            out.join_hash = row["token_hash"]
            out.credential = new_secret("xfc")
        if hello["version"] != VERSION:
            shown = shown_version(hello["version"]) or "an unreadable version"
            return Admission(f"version mismatch: the agent runs xpufleet {shown}, the server {VERSION}; "
                             f"install the same version on both machines")
        return out

    def enrolled(self, name: str) -> bool:
        """Whether ``name`` is a worker the server knows (joined with a credential, a same-machine or SSH
        worker, a pool instance): only a token issued for that name, or its own credential, may take it."""
        if name in self.ctx.workers:
            return True
        return bool(self.ctx.store.query("SELECT 1 FROM workers WHERE name=?", (name,)))

    def name_in_use(self, hello: dict[str, Any], peer: str | None) -> str | None:
        """Why a second agent may not take a name an online agent holds (None when it may): two
        agents under one name would knock each other off forever. The same agent reconnecting (its
        ``instance``) replaces its old connection; so does anyone once the holder has been silent
        past the heartbeat deadline (three missed beats)."""
        name = hello["name"]
        st = self.ctx.workers.get(name)
        old = st.conn if st is not None else None
        if old is None or old.closed or old.identity == agent_identity(hello):
            return None
        silent = time.monotonic() - (st.last_heartbeat or 0.0)
        if silent > protocol.heartbeat_late_s():
            log.warning("worker %s: its agent has been silent for %.0f s; a new agent takes the name", name, silent)
            return None
        pid, host = old.identity[1], old.identity[2]
        holder = f"agent pid {pid} on {host}" if pid and host else "another agent"
        return (f"worker name {name!r} is in use: {holder} (from {old.peer or '?'}) is connected and "
                f"heartbeating; start this agent with another --name, or stop that one first "
                f"(xpufleet agent stop --name {name} on its machine)")

    # --- the connection ------------------------------------------------------------------------------
    async def serve(self, ws: Any, peer: str | None) -> None:
        """Serve one agent WebSocket (already prepared) until it closes."""
        import aiohttp

        try:
            first = await asyncio.wait_for(ws.receive(), timeout=AGENT_HELLO_TIMEOUT_S)
        except asyncio.TimeoutError:
            self.rejections.record(None, peer, None, f"unverified: a connection sent no hello within "
                                                     f"{AGENT_HELLO_TIMEOUT_S:g} s", unverified=True)
            await ws.close(code=4400, message=b"no hello")
            return
        if first.type != aiohttp.WSMsgType.TEXT:
            return
        try:
            hello = protocol.decode(first.data, protocol.AGENT_TO_SIDECAR)
            if hello["type"] == "refused_server":  # an agent that does not trust this server's certificate
                self.rejections.record(hello["name"], peer, None, self._refused_server_claim(hello),
                                       unverified=True)
                await ws.close(code=4403, message=b"noted")
                return
            if hello["type"] != "hello":
                raise protocol.ProtocolError(f"the first message must be hello, not {hello['type']}")
        except protocol.ProtocolError as exc:
            name = _peek_name(first.data)
            self.rejections.record(name, peer, None, f"unverified: bad hello: {exc}", unverified=True)
            with contextlib.suppress(Exception):
                await ws.send_str(json.dumps({"type": "reject", "reason": f"bad hello: {exc}"}))
            await ws.close(code=4400, message=b"bad hello")
            return
        admission = self.authenticate(hello)
        if admission.reason is None:
            admission.reason = self.name_in_use(hello, peer)
        if admission.reason is not None:
            self.rejections.record(hello["name"], peer, shown_version(hello["version"]), admission.reason)
            with contextlib.suppress(Exception):
                await ws.send_str(protocol.encode("reject", reason=admission.reason))
            await ws.close(code=4403, message=b"refused")
            return
        conn = Connection(ws, hello["name"], peer, hello)
        st = await self._attach(conn, hello, admission)
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
                elif msg["type"] == "outputs_data":
                    conn.answer(msg)
                elif msg["type"] == "comfyui":
                    self._on_comfyui(st, msg)
                elif msg["type"] in self.message_handlers:  # inference unit instances (server/units)
                    try:
                        await self.message_handlers[msg["type"]](st.name, msg)
                    except Exception:  # noqa: BLE001 - one bad handler must not drop the agent
                        log.exception("worker %s: handling %s failed", st.name, msg["type"])
        finally:
            conn.fail_pending()
            self._detach(st, conn)

    def _refused_server_claim(self, msg: dict[str, Any]) -> str:
        """The sentence listed for a ``refused_server``: the peer sent no secret, so it is a claim; only its
        worker name and two fingerprints (hex pairs, by the contract) are quoted, and the one instruction
        comes from this server."""
        own = self.ctx.links.tls_fingerprint()
        if own is None:
            seen = (f"it saw certificate {msg['seen']}, yet this server serves plain HTTP (no certificate): "
                    f"something else answered that agent")
        elif msg["seen"] != own:
            seen = (f"it saw certificate {msg['seen']}, which is not this server's ({own}): something between "
                    f"them presents another certificate, or the claim is false")
        else:
            seen = f"this server presents {own}"
        return (f"unverified: a connection that presented no credential says agent {msg['name']!r} refused this "
                f"server's TLS certificate: it pins {msg['pinned']}; {seen}. If that agent is yours, give it "
                f"the join command `xpufleet workers join-token --name {msg['name']}` prints on this server")

    async def _attach(self, conn: Connection, hello: dict[str, Any], admission: Admission) -> WorkerState:
        name = hello["name"]
        now = time.time()
        join_hash, credential = admission.join_hash, admission.credential
        st = self.ctx.workers.get(name)
        if st is None:
            st = self.ctx.workers[name] = WorkerState(name=name, created_at=now)
        if credential is not None:
            st.auth = "credential"
        elif admission.pool is not None:
            st.auth = "pool"
        elif hello["auth"]["kind"] == "session" and st.auth not in ("credential", "ssh"):
            st.auth = "session"
        st.version = hello["version"]
        st.env = dict(hello.get("env") or {})
        st.node_types = list(hello["node_types"])
        st.devices = _clean_devices(hello["devices"])
        st.mounts = dict(hello.get("mounts") or {})  # a change re-resolves runs waiting for a mount
        st.one_shot = bool(hello.get("one_shot"))
        held = [r["run_id"] for r in hello.get("runs") or []]
        if st.one_shot and st.taken is None and held:
            st.taken = held[0]  # after a server restart: the run it took before
        st.capabilities = tuple(hello.get("capabilities") or ())
        # a ComfyUI announced in hello is read anew by its agent: ComfyUI runs wait for the new reading
        st.comfyui_state = STATE_PROBING if COMFYUI_CAPABILITY in st.capabilities else STATE_NONE
        if st.comfyui_state == STATE_NONE:
            st.comfyui = None
        st.last_seen = now
        with self.ctx.store.transaction() as db:
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
        if admission.pool is not None:
            self.pools.joined(st, admission.pool)
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
        active = {r["id"]: r for r in self.ctx.table.active_runs(name)}
        known = {rid: self.ctx.store.last_source_seq(rid) for rid in active}
        await conn.send("welcome", name=name, server_version=VERSION, runs=known, credential=credential,
                        heartbeat_interval_s=protocol.heartbeat_interval_s(),
                        resume_grace_s=protocol.resume_grace_s())
        log.info("worker %s connected from %s (%d device(s), %d run(s) to take over)",
                 name, conn.peer, len(st.devices), len(known))
        if st.provider is None:
            st.provider = self.provider(name)
            self.ctx.runs.register_provider(st.provider)
        else:
            self.ctx.runs.providers_changed()
        if st.pool is not None:
            self.pools.sync()
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
            if run["status"] == "assigned" and self.ctx.store.last_source_seq(run_id) == 0:
                full = self.ctx.store.get_run(run_id, with_graph=True)
                if full is not None and full.get("budget_gib") is not None \
                        and not can_cap(st.provider or self.provider(st.name)):
                    # docs/workers.md: a run admitted by budget never starts on an agent that cannot cap it
                    self.ctx.runs.run_ended(run_id, "failed", f"{cap_refusal(st.name)}; it reconnected before "
                                                  f"this run (budget {full['budget_gib']:.1f} GiB) started")
                elif full is not None:  # sent before the connection broke, never received: send again
                    await self.send_start(conn, full, list(run["devices"]))
                continue
            self.ctx.runs.run_ended(
                run_id, "interrupted",
                f"worker {st.name} reconnected without this run (its agent was restarted); the run was interrupted",
            )

    def _detach(self, st: WorkerState, conn: Connection) -> None:
        if st.conn is not conn:
            return  # replaced by a newer connection
        st.conn = None
        st.disconnected_at = time.monotonic()
        with contextlib.suppress(Exception):
            with self.ctx.store.transaction() as db:
                db.execute("UPDATE workers SET last_seen=? WHERE name=?", (st.last_seen, st.name))
        if self.ctx.workers.get(st.name) is st and self.ctx.table.active_runs(st.name):
            self.grace.schedule(st)
        log.info("worker %s disconnected", st.name)
        if not self.pools.maybe_depart(st):  # a one-shot instance that left is forgotten
            self.ctx.runs.providers_changed()
            if st.pool is not None:
                self.pools.sync()
        for listener in self.connection_listeners:
            listener(st.name, False)

    async def send_start(self, conn: AgentLink, run: dict[str, Any], devices: list[str]) -> bool:
        """Send one run to an agent."""
        extra = {"spread": run["spread"]} if run.get("spread") else {}  # rank 0 of a run spread over workers
        return await conn.send(
            "start_run", run_id=run["id"], graph=run["graph"], options=run.get("options") or {},
            devices=list(devices), budget_gib=run.get("budget_gib"), **extra,
        )

    def _on_comfyui(self, st: WorkerState, msg: dict[str, Any]) -> None:
        """The agent read its ComfyUI: keep the reading; ComfyUI runs waiting for it are resolved again."""
        st.comfyui = reading_of(msg)
        st.comfyui_state = st.comfyui.state
        log.info("worker %s: ComfyUI %s (%s, %d node classes)", st.name, st.comfyui_state,
                 st.comfyui.version or st.comfyui.error, len(st.comfyui.classes))
        self.ctx.runs.providers_changed()

    async def _on_heartbeat(self, st: WorkerState, conn: Connection, msg: dict[str, Any]) -> None:
        st.last_heartbeat = time.monotonic()
        devices = _clean_devices(msg["devices"])
        changed = _offer_key(devices) != _offer_key(st.devices)
        st.devices = devices
        with self.ctx.store.transaction() as db:
            db.execute("UPDATE workers SET devices=?, last_seen=? WHERE name=?",
                       (json.dumps(devices), st.last_seen, st.name))
        if changed:
            self.ctx.runs.providers_changed()
        self.ctx.runs.memory.report(st.name, devices)  # shared cards: total and free for the ledger
        self.ctx.runs.memory.run_usage(st.name, [r for r in msg.get("runs") or [] if r.get("memory")])
        for r in msg.get("runs") or []:
            run = self.ctx.store.get_run(r["run_id"])
            if run is None or run["worker_id"] != st.name or run["status"] in TERMINAL_STATUSES:
                await conn.send("forget_run", run_id=r["run_id"], reason="the server does not expect this run")
            else:
                await conn.send("ack", run_id=r["run_id"], seq=self.ctx.store.last_source_seq(r["run_id"]))

    async def _on_event(self, st: WorkerState, conn: Connection, msg: dict[str, Any]) -> None:
        run_id = msg["run_id"]
        run = self.ctx.store.get_run(run_id)
        if run is None or run["worker_id"] != st.name:
            log.warning("worker %s sent an event for run %s, which is not its run; ignored", st.name, run_id)
            await conn.send("forget_run", run_id=run_id, reason="not a run of this worker")
            return
        if run["status"] in TERMINAL_STATUSES:
            await conn.send("forget_run", run_id=run_id, reason=f"the run already ended ({run['status']})")
            return
        if run["status"] == "assigned":
            self.ctx.runs.run_process_started(run_id, None)
        if msg["event_type"] == "run_finished" and self.outputs.wants_upload(run):
            self.outputs.start_upload(st, conn, run, msg)  # the run ends once its outputs are copied here
            return
        self.ctx.runs.ingest(run_id, [{"seq": msg["seq"], "type": msg["event_type"],
                                             "payload": msg["payload"], "ts": msg.get("ts")}])
        if msg["event_type"] == "run_finished":
            await conn.send("ack", run_id=run_id, seq=msg["seq"])

    def _log_limit_warnings(self, name: str) -> None:
        """An override lowered by a smaller limit of another provider is logged on connect (docs/workers.md)."""
        for w in self.limit_warnings(name):
            if w not in self._announced_warnings:
                self._announced_warnings.add(w)
                log.warning("slot limits: %s", w)


def agent_identity(hello: dict[str, Any]) -> tuple[Any, ...]:
    """Which agent process said ``hello``: its ``instance`` id, with pid and host (older agents
    send no instance; their pid and host tell them apart)."""
    env = hello.get("env") if isinstance(hello.get("env"), dict) else {}
    pid = hello.get("pid") if isinstance(hello.get("pid"), int) else None
    host = env.get("hostname") if isinstance(env.get("hostname"), str) else None
    return (hello.get("instance"), pid, host)


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


def shown_version(version: Any) -> str | None:
    """``version`` when it looks like a version string, else None (a peer's free text is not repeated)."""
    return version if isinstance(version, str) and _VERSION_SHOWN.fullmatch(version) else None


def _peek_name(data: Any) -> str | None:
    """The worker name a malformed first message carries, when it is one (else None)."""
    try:
        name = json.loads(data).get("name")
    except Exception:  # noqa: BLE001
        return None
    return name if isinstance(name, str) and protocol.worker_name_problem(name) is None else None
