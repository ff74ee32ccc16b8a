"""Durable state of the sidecar: runs and their event logs in SQLite (docs/sidecar.md, "State on disk").

Calls are answered from an in-memory copy of ``state.db`` (loaded at start, ahead of the file by the
transactions queued for it), so no call on the event loop waits on the file's write lock, which Optuna's
thread or another process may hold; each committed transaction goes to the one writer thread
(``store_writer.py``), which applies it to the file in commit order, many in one file transaction. A
create that answers 201 runs inside :meth:`Store.acknowledged`, which waits (without blocking the loop)
until its transactions are in the file, or refuses it with 507/503 after taking it back from memory.
Every change is one transaction: a failure rolls back and leaves nothing half written. Each run's events get a gapless ``cursor`` (1, 2, 3, ...) allocated in the same
transaction as the insert; events relayed from a run child carry the child's ``seq`` (``source_seq``)
so a replay (a worker reconnecting) is stored once.

Other modules add their own tables with :meth:`Store.ensure_schema` (workers, memory ledger, ...).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...common.errors import StoreError
from ...constants import RUN_KIND_GRAPH, RUN_STATUSES, STORE_FLUSH_ON_CLOSE_S, TERMINAL_STATUSES
from ..comfyflow.kind import run_kind
from ..run.events import NewEvent, finite
from .store_durable import CURRENT_ACK, Acknowledgement, open_state, probe_or_refuse
from .store_writer import Batch, Recorder, WriteFailure, writes

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT NOT NULL UNIQUE,
    name TEXT,
    status TEXT NOT NULL,
    target TEXT NOT NULL,
    placement TEXT,
    worker_id TEXT,
    devices TEXT NOT NULL DEFAULT '[]',
    requested TEXT NOT NULL DEFAULT '[]',
    candidates TEXT NOT NULL DEFAULT '[]',
    queue_key TEXT,
    budget_gib REAL,
    budget_source TEXT,
    graph TEXT NOT NULL,
    options TEXT NOT NULL,
    seed INTEGER,
    error TEXT,
    waiting_reason TEXT,
    warnings TEXT NOT NULL DEFAULT '[]',
    execution_facts TEXT NOT NULL DEFAULT '{}',
    peak_memory TEXT,
    final_metrics TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    pid INTEGER,
    run_dir TEXT,
    last_cursor INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    assigned_at REAL,
    started_at REAL,
    finished_at REAL,
    source TEXT NOT NULL DEFAULT 'api', kind TEXT NOT NULL DEFAULT 'graph'
);
CREATE INDEX IF NOT EXISTS runs_status ON runs(status, seq);
CREATE INDEX IF NOT EXISTS runs_worker ON runs(worker_id, seq);
CREATE TABLE IF NOT EXISTS events (
    run_id TEXT NOT NULL,
    cursor INTEGER NOT NULL,
    type TEXT NOT NULL,
    payload TEXT NOT NULL,
    ts REAL NOT NULL,
    source_seq INTEGER,
    PRIMARY KEY (run_id, cursor)
) WITHOUT ROWID;
CREATE UNIQUE INDEX IF NOT EXISTS events_source ON events(run_id, source_seq) WHERE source_seq IS NOT NULL;
CREATE INDEX IF NOT EXISTS events_type ON events(run_id, type, cursor);
"""

ACTIVE_STATUSES = ("assigned", "running")
_JSON_COLUMNS = ("devices", "requested", "candidates", "options", "warnings", "execution_facts")
_JSON_NULLABLE = ("peak_memory", "final_metrics")


def new_run_id() -> str:
    return uuid.uuid4().hex


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str)


def _dumps_lenient(value: Any) -> str:
    """Event payloads may hold NaN (a diverged loss): stored as JSON null instead of failing the insert."""
    try:
        return _dumps(value)
    except ValueError:
        return _dumps(finite(value))


@dataclass(frozen=True)
class AppendResult:
    stored: int  # events newly stored (duplicates of an earlier source_seq are skipped)
    finished: str | None  # the terminal status, when a run_finished event ended the run here


class Store:
    """The sidecar's SQLite state under ``$XPUFLEET_HOME/state.db``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._writer, self._db = open_state(self.path)
        self._lock = threading.RLock()
        self._writer.bind(self._lock, self._rebuild)
        self._writer.start()
        self._writes: Recorder | None = None  # the open transaction's statements (nested calls join it)
        with self.transaction() as db:
            for stmt in _statements(_SCHEMA):
                db.execute(stmt)
            db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('schema:core', ?)", (str(SCHEMA_VERSION),))
            # a state.db from before run sources (every run came through POST /api/runs) or kinds (training graphs)
            columns = {r["name"] for r in db.execute("PRAGMA table_info(runs)")}
            for name, default in (("source", "api"), ("kind", RUN_KIND_GRAPH)):
                if name not in columns:
                    db.execute(f"ALTER TABLE runs ADD COLUMN {name} TEXT NOT NULL DEFAULT '{default}'")
        # the schema and a probe write are in the file before anything is served: a full disk stops start-up
        probe_or_refuse(self._writer, self.path)

    # --- plumbing ---------------------------------------------------------------------------------

    def close(self, timeout: float | None = STORE_FLUSH_ON_CLOSE_S) -> bool:
        """Write the queued transactions to the file (up to ``timeout`` s) and close; False when some
        could not be written in time (the file stayed locked; logged)."""
        written = self._writer.close(timeout)  # not under the lock: a take-back in the writer needs it
        with self._lock:
            self._db.close()
        return written

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every committed transaction is in the file (blocking; False on timeout)."""
        return self._writer.flush(timeout)

    async def flushed(self, timeout: float | None = None) -> bool:
        """:meth:`flush` without blocking the event loop."""
        return await asyncio.to_thread(self._writer.flush, timeout)

    @property
    def failure(self) -> WriteFailure | None:
        """Why the file refuses writes now (full, locked, I/O error); None while writes land."""
        return self._writer.failure

    @contextlib.asynccontextmanager
    async def acknowledged(self) -> AsyncIterator[Acknowledgement]:
        """The body's transactions (in this task and the threads it hands work to) are in ``state.db``
        when the block ends: it waits, off the loop, for the writer's group commit. When the file cannot
        take them (a full disk at once; a lock held past ``STORE_ACK_TIMEOUT_S``) they are taken back,
        from memory too, and a :class:`StoreError` 507/503 says why: never a 201 for what is not on disk."""
        ack = Acknowledgement(asyncio.get_running_loop())
        token = CURRENT_ACK.set(ack)
        try:
            yield ack
        finally:
            CURRENT_ACK.reset(token)
        await ack.wait()
        if ack.failure is not None:
            raise StoreError(f"{ack.failure.text}; nothing of this request was stored: submit it again once "
                             f"GET /api/health says the store is ok", ack.failure.status)

    def _rebuild(self, kept: list[Batch]) -> None:
        """The in-memory copy again: the file's content plus the batches still queued for it (called by
        the writer, under this store's lock, after it took refused batches back)."""
        fresh = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        self._writer.copy_to(fresh)
        fresh.row_factory = sqlite3.Row
        for batch in kept:
            fresh.execute("BEGIN")
            try:
                for sql, params, many in batch:
                    (fresh.executemany if many else fresh.execute)(sql, params)
            except sqlite3.Error:  # it failed in memory first, so it will fail in the file too
                fresh.execute("ROLLBACK")
                continue
            fresh.execute("COMMIT")
        old, self._db = self._db, fresh
        old.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One atomic write (nested calls join the outer transaction); once committed, its statements
        are queued for the file in the same order."""
        with self._lock:
            if self._writes is not None:
                yield self._writes  # type: ignore[misc]  # records like a connection
                return
            self._db.execute("BEGIN IMMEDIATE")
            self._writes = Recorder(self._db)
            try:
                yield self._writes  # type: ignore[misc]
            except BaseException:
                self._writes = None
                self._db.execute("ROLLBACK")
                raise
            else:
                done, self._writes = self._writes, None
                self._db.execute("COMMIT")
                ack = CURRENT_ACK.get()
                self._writer.submit(done.statements, ack.add() if ack is not None and done.statements else None)

    def query(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Rows of one statement (a write among them runs as its own transaction)."""
        if writes(sql):
            with self.transaction() as db:
                return db.execute(sql, params).fetchall()
        with self._lock:
            return self._db.execute(sql, params).fetchall()

    def ensure_schema(self, name: str, ddl: str, version: int = 1) -> None:
        """Create another module's tables (idempotent). ``ddl``: ``CREATE ... IF NOT EXISTS`` statements.

        The version is recorded under ``schema:<name>`` in ``meta`` so a module can migrate later.
        """
        with self.transaction() as db:
            for stmt in _statements(ddl):
                db.execute(stmt)
            db.execute(
                "INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (f"schema:{name}", str(version)),
            )

    def schema_version(self, name: str) -> int | None:
        rows = self.query("SELECT value FROM meta WHERE key=?", (f"schema:{name}",))
        return int(rows[0]["value"]) if rows else None

    # --- runs -------------------------------------------------------------------------------------

    def create_run(
        self,
        *,
        graph: Mapping[str, Any],
        options: Mapping[str, Any],
        target: str,
        requested: Sequence[str],
        candidates: Sequence[Mapping[str, Any]],
        queue_key: str,
        name: str | None = None,
        seed: int | None = None,
        budget_gib: float | None = None,
        budget_source: str | None = None,
        warnings: Sequence[Mapping[str, Any]] = (),
        run_id: str | None = None,
        now: float | None = None,
    ) -> str:
        """Insert a queued run with its first events (``status`` queued, then each warning)."""
        run_id = run_id or new_run_id()
        now = time.time() if now is None else now
        with self.transaction() as db:
            db.execute(
                "INSERT INTO runs(id, name, status, target, requested, candidates, queue_key, budget_gib,"
                " budget_source, graph, options, seed, created_at, kind) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, name, "queued", target, _dumps(list(requested)), _dumps(list(candidates)), queue_key,
                 budget_gib, budget_source, _dumps(graph), _dumps(options), seed, now, run_kind(graph)),
            )
            events = [NewEvent("status", {"status": "queued", "target": target, "queue_key": queue_key}, now)]
            events += [NewEvent("run_warning", dict(w), now) for w in warnings]
            self._append(db, run_id, events)
        return run_id

    def create_canvas_run(self, *, graph: Mapping[str, Any], name: str | None, facts: Mapping[str, Any],
                          now: float | None = None) -> str:
        """Insert a run ComfyUI is executing right now (source ``canvas``, docs/canvas-runs.md): it is
        ``running`` from the start and holds no slot here (ComfyUI's process runs it, not a provider)."""
        run_id = new_run_id()
        now = time.time() if now is None else now
        with self.transaction() as db:
            db.execute(
                "INSERT INTO runs(id, name, status, target, placement, graph, options, execution_facts, created_at,"
                " started_at, source) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                (run_id, name, "running", "canvas", "canvas", _dumps(graph), _dumps({}), _dumps(dict(facts)), now,
                 now, "canvas"),
            )
            self._append(db, run_id, [NewEvent("status", {"status": "running", "placement": "canvas"}, now)])
        return run_id

    def set_name(self, run_id: str, name: str | None) -> None:
        """A run's name given after it was made (a canvas run's workflow name)."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET name=? WHERE id=?", (name, run_id))

    def get_run(self, run_id: str, *, with_graph: bool = False) -> dict[str, Any] | None:
        rows = self.query("SELECT * FROM runs WHERE id=?", (run_id,))
        return _row_to_run(rows[0], with_graph) if rows else None

    def list_runs(
        self,
        *,
        statuses: Iterable[str] | None = None,
        name: str | None = None,
        worker: str | None = None,
        source: str | None = None,
        limit: int = 50,
        offset: int = 0,
    ) -> tuple[list[dict[str, Any]], int]:
        """Runs newest first, filtered (status in ``statuses``, name substring, worker, source) and paged."""
        where: list[str] = []
        params: list[Any] = []
        if statuses:
            sts = list(statuses)
            where.append(f"status IN ({','.join('?' * len(sts))})")
            params += sts
        if name:
            where.append("name LIKE ? ESCAPE '\\'")
            params.append("%" + name.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%")
        if worker:
            if worker == "local":
                where.append("(placement = 'local' OR (placement IS NULL AND target = 'local'))")
            else:
                where.append("(worker_id = ? OR (worker_id IS NULL AND target = ?))")
                params += [worker, worker]
        if source:
            where.append("source = ?")
            params.append(source)
        clause = (" WHERE " + " AND ".join(where)) if where else ""
        with self._lock:
            total = self._db.execute(f"SELECT COUNT(*) FROM runs{clause}", params).fetchone()[0]
            rows = self._db.execute(
                f"SELECT * FROM runs{clause} ORDER BY seq DESC LIMIT ? OFFSET ?", [*params, limit, offset]
            ).fetchall()
        return [_row_to_run(r, False) for r in rows], int(total)

    def counts(self) -> dict[str, int]:
        out = {s: 0 for s in RUN_STATUSES}
        for r in self.query("SELECT status, COUNT(*) AS n FROM runs GROUP BY status"):
            out[r["status"]] = int(r["n"])
        return out

    def queued(self) -> list[tuple[str, list[dict[str, Any]]]]:
        """(run id, candidates) of every queued run, in submission order."""
        rows = self.query("SELECT id, candidates FROM runs WHERE status='queued' ORDER BY seq")
        return [(r["id"], json.loads(r["candidates"])) for r in rows]

    def active(self) -> list[dict[str, Any]]:
        """Assigned and running runs (they hold slots)."""
        rows = self.query("SELECT * FROM runs WHERE status IN ('assigned','running') ORDER BY seq")
        return [_row_to_run(r, False) for r in rows]

    def assign(self, run_id: str, *, provider: str, placement: str, devices: Sequence[str], run_dir: str | None,
               now: float | None = None) -> bool:
        """queued -> assigned (False when the run is no longer queued, e.g. cancelled meanwhile)."""
        now = time.time() if now is None else now
        with self.transaction() as db:
            cur = db.execute(
                "UPDATE runs SET status='assigned', worker_id=?, placement=?, devices=?, run_dir=?, assigned_at=?,"
                " waiting_reason=NULL WHERE id=? AND status='queued'",
                (None if placement == "local" else provider, placement, _dumps(list(devices)), run_dir, now, run_id),
            )
            if cur.rowcount != 1:
                return False
            self._append(db, run_id, [NewEvent("status", {
                "status": "assigned", "worker_id": None if placement == "local" else provider,
                "placement": placement, "devices": list(devices)}, now)])
        return True

    def mark_running(self, run_id: str, *, pid: int | None = None, now: float | None = None) -> bool:
        now = time.time() if now is None else now
        with self.transaction() as db:
            cur = db.execute(
                "UPDATE runs SET status='running', pid=?, started_at=? WHERE id=? AND status='assigned'",
                (pid, now, run_id),
            )
            if cur.rowcount != 1:
                return False
            self._append(db, run_id, [NewEvent("status", {"status": "running"}, now)])
        return True

    def request_cancel(self, run_id: str) -> None:
        with self.transaction() as db:
            db.execute("UPDATE runs SET cancel_requested=1 WHERE id=?", (run_id,))

    def set_candidates(self, candidates: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
        """Replace the candidates of queued runs resolved again (pool instances, mounts that came)."""
        if not candidates:
            return
        with self.transaction() as db:
            db.executemany("UPDATE runs SET candidates=? WHERE id=? AND status='queued'",
                           [(_dumps(list(c)), run_id) for run_id, c in candidates.items()])

    def queued_targets(self, targets: Sequence[str] = ("any",), prefix: str = "pool:") -> list[dict[str, Any]]:
        """Queued runs whose target is one of ``targets`` or starts with ``prefix``, or without a candidate yet,
        with their graph and options, in submission order (resolved again after a restart)."""
        marks = ",".join("?" * len(targets))
        rows = self.query(f"SELECT id, target, graph, options FROM runs WHERE status='queued' AND "
                          f"(target IN ({marks}) OR substr(target, 1, ?)=? OR candidates='[]') ORDER BY seq",
                          (*targets, len(prefix), prefix))
        return [{"id": r["id"], "target": r["target"], "graph": json.loads(r["graph"]),
                 "options": json.loads(r["options"])} for r in rows]

    def set_budget(self, run_id: str, budget_gib: float | None, budget_source: str | None) -> None:
        """A queued run's budget changed (the memory ledger raised it or gave it the default)."""
        with self.transaction() as db:
            db.execute("UPDATE runs SET budget_gib=?, budget_source=? WHERE id=?", (budget_gib, budget_source, run_id))

    def set_waiting_reasons(self, reasons: Mapping[str, str | None]) -> None:
        """Update ``waiting_reason`` of queued runs in one transaction."""
        if not reasons:
            return
        with self.transaction() as db:
            db.executemany(
                "UPDATE runs SET waiting_reason=? WHERE id=? AND status='queued'",
                [(reason, run_id) for run_id, reason in reasons.items()],
            )

    def finish(
        self,
        run_id: str,
        status: str,
        *,
        error: str | None = None,
        final_metrics: Mapping[str, Any] | None = None,
        peak_memory: Mapping[str, Any] | None = None,
        execution_facts: Mapping[str, Any] | None = None,
        now: float | None = None,
    ) -> bool:
        """End a run that has not ended yet, appending the server's own ``run_finished`` event.

        For a run whose child reported ``run_finished``, use :meth:`append_events` instead (it ends
        the run in the same transaction). False when the run had already ended.
        """
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"{status!r} is not a terminal status")
        now = time.time() if now is None else now
        with self.transaction() as db:
            row = db.execute("SELECT status FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None or row["status"] in TERMINAL_STATUSES:
                return False
            payload = _finished(status, error, final_metrics, peak_memory, execution_facts)
            self._append(db, run_id, [NewEvent("run_finished", payload, now)])
        return True

    def end_queued(self, run_ids: Sequence[str], status: str, error: str) -> list[str]:
        """End the runs of ``run_ids`` that are still queued, in one transaction, as :meth:`finish` ends
        one (``cancel_requested`` set too, as a cancel does); returns those it ended."""
        if status not in TERMINAL_STATUSES:
            raise ValueError(f"{status!r} is not a terminal status")
        ended = []
        with self.transaction() as db:
            for run_id in run_ids:
                row = db.execute("SELECT status FROM runs WHERE id=?", (run_id,)).fetchone()
                if row is None or row["status"] != "queued":
                    continue
                db.execute("UPDATE runs SET cancel_requested=1 WHERE id=?", (run_id,))
                self._append(db, run_id, [NewEvent("run_finished", _finished(status, error), time.time())])
                ended.append(run_id)
        return ended

    def delete_run(self, run_id: str) -> dict[str, Any]:
        """Delete a finished run's record and events; 404/409 via StoreError otherwise."""
        with self.transaction() as db:
            row = db.execute("SELECT * FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None:
                raise StoreError(f"no run {run_id!r}", 404)
            if row["status"] not in TERMINAL_STATUSES:
                raise StoreError(
                    f"run {run_id} is {row['status']}: only a finished run can be deleted (cancel it first)", 409
                )
            db.execute("DELETE FROM events WHERE run_id=?", (run_id,))
            db.execute("DELETE FROM runs WHERE id=?", (run_id,))
            return _row_to_run(row, False)

    # --- events -----------------------------------------------------------------------------------

    def append_events(self, run_id: str, events: Sequence[NewEvent]) -> AppendResult:
        """Append events atomically; a ``run_finished`` among them ends the run (once)."""
        if not events:
            return AppendResult(0, None)
        with self.transaction() as db:
            return self._append(db, run_id, events)

    def _append(self, db: sqlite3.Connection, run_id: str, events: Sequence[NewEvent]) -> AppendResult:
        row = db.execute("SELECT last_cursor, status, warnings FROM runs WHERE id=?", (run_id,)).fetchone()
        if row is None:
            raise StoreError(f"no run {run_id!r}", 404)
        cursor = int(row["last_cursor"])
        status = row["status"]
        warnings: list[Any] | None = None
        finished: str | None = None
        stored = 0
        now = time.time()
        for ev in events:
            if ev.source_seq is not None and db.execute(
                "SELECT 1 FROM events WHERE run_id=? AND source_seq=?", (run_id, ev.source_seq)
            ).fetchone():
                continue  # a replay of an event stored before
            if ev.type == "run_finished" and (status in TERMINAL_STATUSES or finished):
                continue  # a run ends once; a late report of an already ended run is dropped
            payload = dict(ev.payload)
            cursor += 1
            stored += 1
            db.execute(
                "INSERT INTO events(run_id, cursor, type, payload, ts, source_seq) VALUES (?,?,?,?,?,?)",
                (run_id, cursor, ev.type, _dumps_lenient(payload), float(ev.ts if ev.ts is not None else now),
                 ev.source_seq),
            )
            if ev.type == "run_warning":
                if warnings is None:
                    warnings = json.loads(row["warnings"])
                warnings.append(payload)
            elif ev.type == "run_finished":
                finished = self._apply_finished(db, run_id, payload, ev.ts if ev.ts is not None else now)
        db.execute(
            "UPDATE runs SET last_cursor=?" + (", warnings=?" if warnings is not None else "") + " WHERE id=?",
            (cursor, _dumps_lenient(warnings), run_id) if warnings is not None else (cursor, run_id),
        )
        return AppendResult(stored, finished)

    @staticmethod
    def _apply_finished(db: sqlite3.Connection, run_id: str, payload: Mapping[str, Any], ts: float) -> str:
        status = payload.get("status")
        if status not in TERMINAL_STATUSES:
            status = "failed"
        error = payload.get("error")
        facts = payload.get("execution_facts")
        sets = ["status=?", "error=?", "finished_at=?", "final_metrics=?", "peak_memory=?", "waiting_reason=NULL"]
        params: list[Any] = [status, None if error is None else str(error), ts,
                             _dumps_lenient(payload.get("final_metrics") or {}),
                             _dumps_lenient(payload.get("peak_memory"))]
        if isinstance(facts, Mapping) and facts:
            row = db.execute("SELECT execution_facts FROM runs WHERE id=?", (run_id,)).fetchone()
            merged = {**json.loads(row["execution_facts"]), **facts}
            sets.append("execution_facts=?")
            params.append(_dumps_lenient(merged))
        db.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id=?", [*params, run_id])
        return str(status)

    def set_execution_facts(self, run_id: str, facts: Mapping[str, Any]) -> None:
        """Merge facts known before the child reports (placement, visible devices)."""
        with self.transaction() as db:
            row = db.execute("SELECT execution_facts FROM runs WHERE id=?", (run_id,)).fetchone()
            if row is None:
                return
            merged = {**json.loads(row["execution_facts"]), **facts}
            db.execute("UPDATE runs SET execution_facts=? WHERE id=?", (_dumps_lenient(merged), run_id))

    def events_after(self, run_id: str, cursor: int = 0, limit: int = 1000,
                     types: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """Events with ``cursor`` greater than the given one, oldest first."""
        sql = "SELECT cursor, type, payload, ts FROM events WHERE run_id=? AND cursor>?"
        params: list[Any] = [run_id, int(cursor)]
        if types:
            sql += f" AND type IN ({','.join('?' * len(types))})"
            params += list(types)
        sql += " ORDER BY cursor LIMIT ?"
        params.append(int(limit))
        return [
            {"cursor": r["cursor"], "type": r["type"], "payload": json.loads(r["payload"]), "ts": r["ts"]}
            for r in self.query(sql, params)
        ]

    def last_source_seq(self, run_id: str) -> int:
        rows = self.query("SELECT MAX(source_seq) AS m FROM events WHERE run_id=?", (run_id,))
        return int(rows[0]["m"] or 0) if rows else 0

    def last_cursor(self, run_id: str) -> int | None:
        rows = self.query("SELECT last_cursor FROM runs WHERE id=?", (run_id,))
        return int(rows[0]["last_cursor"]) if rows else None


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _finished(status: str, error: str | None, final_metrics: Mapping[str, Any] | None = None,
              peak_memory: Mapping[str, Any] | None = None,
              execution_facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The payload of the server's own ``run_finished`` event."""
    return {"status": status, "error": error, "final_metrics": dict(final_metrics or {}),
            "peak_memory": dict(peak_memory) if peak_memory is not None else None,
            "execution_facts": dict(execution_facts or {})}


def _row_to_run(row: sqlite3.Row, with_graph: bool) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": row["id"],
        "name": row["name"],
        "status": row["status"],
        "target": row["target"],
        "placement": row["placement"],
        "worker_id": row["worker_id"],
        "queue_key": row["queue_key"],
        "budget_gib": row["budget_gib"],
        "budget_source": row["budget_source"],
        "seed": row["seed"],
        "error": row["error"],
        "waiting_reason": row["waiting_reason"],
        "cancel_requested": bool(row["cancel_requested"]),
        "cursor": row["last_cursor"],
        "created_at": row["created_at"],
        "assigned_at": row["assigned_at"],
        "started_at": row["started_at"],
        "finished_at": row["finished_at"],
        "run_dir": row["run_dir"],
        "pid": row["pid"],
        "source": row["source"],
        "kind": row["kind"],  # graph (the fleet's executor) or comfyui (comfyflow/kind.py)
    }
    for col in _JSON_COLUMNS:
        out[col] = json.loads(row[col])
    for col in _JSON_NULLABLE:
        out[col] = json.loads(row[col]) if row[col] is not None else None
    if with_graph:
        out["graph"] = json.loads(row["graph"])
    return out
