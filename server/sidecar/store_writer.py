"""The one writer of ``state.db`` (docs/sidecar.md, "State on disk").

The store answers every call from an in-memory copy of the database (never locked by anyone else) and
hands each committed transaction's statements here. One thread owns the file's connection and applies
them in commit order, each batch in one transaction, so the event loop never waits on SQLite's write
lock: Optuna's thread, or any other process, may hold it for seconds and only this thread waits.
"""

from __future__ import annotations

import collections
import logging
import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...common.backoff import Backoff
from ...constants import STORE_BUSY_TIMEOUT_S

log = logging.getLogger("xpufleet.store")

# (sql, parameters, many): one statement of a committed transaction, as the store ran it in memory
Statement = tuple[str, Any, bool]
Batch = tuple[Statement, ...]

# a batch that failed with one of these is tried again (the file is locked or full, the disk hiccuped);
# any other error cannot succeed on a retry and would hold up every later batch
_RETRIED = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})


def retried(exc: sqlite3.Error) -> bool:
    """Whether a failed batch is tried again: the file was busy, locked, full or had an I/O error."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _RETRIED


class DiskWriter:
    """The thread that owns ``state.db``'s connection: :meth:`submit` queues a batch, applied in order."""

    def __init__(self, path: Path, *, busy_timeout_s: float = STORE_BUSY_TIMEOUT_S,
                 retry_first_s: float = 0.05, retry_max_s: float = 2.0) -> None:
        self.path = path
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")  # readers of the file (CLI, Optuna) never block this writer
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        self._queue: collections.deque[Batch] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._abandoned = False  # close() gave up waiting: the retrying batch and the queue are dropped
        self._backoff = Backoff(retry_first_s, retry_max_s)
        self._thread = threading.Thread(target=self._run, name="xpufleet-store-writer", daemon=True)

    def copy_to(self, target: sqlite3.Connection) -> None:
        """Copy the file's committed content into ``target`` (before :meth:`start`)."""
        self._db.backup(target)

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    @property
    def pending(self) -> int:
        """Batches not written yet (the one being written included)."""
        with self._cond:
            return len(self._queue)

    def submit(self, batch: Sequence[Statement]) -> None:
        """Queue one committed transaction's statements; they reach the file after every earlier batch."""
        if not batch:
            return
        with self._cond:
            if self._closing:
                raise RuntimeError("the store is closed")
            self._queue.append(tuple(batch))
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every batch submitted so far is written (or dropped); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue, timeout)

    def close(self, timeout: float | None) -> bool:
        """Write the queue (up to ``timeout`` s), stop the thread and close the file. False when batches
        were left unwritten (logged with their count)."""
        drained = self.flush(timeout) if self._thread.is_alive() else not self._queue
        with self._cond:
            self._closing = True
            if not drained:
                self._abandoned = True
                log.error("state.db: %d transactions not written at shutdown (the file stayed locked or full)",
                          len(self._queue))
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(STORE_BUSY_TIMEOUT_S + 5.0)
        self._db.close()
        return drained

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if not self._queue or self._abandoned:
                    self._queue.clear()
                    self._cond.notify_all()
                    return
                batch = self._queue[0]
            self._write(batch)
            with self._cond:
                if self._queue:
                    self._queue.popleft()
                self._cond.notify_all()

    def _write(self, batch: Batch) -> None:
        """Apply one batch in one transaction, trying again while the file is locked."""
        while True:
            try:
                self._db.execute("BEGIN IMMEDIATE")
                try:
                    for sql, params, many in batch:
                        (self._db.executemany if many else self._db.execute)(sql, params)
                    self._db.execute("COMMIT")
                except BaseException:
                    if self._db.in_transaction:
                        self._db.execute("ROLLBACK")
                    raise
            except Exception as exc:  # the thread must live on: a dead writer would hold every later batch
                if isinstance(exc, sqlite3.Error) and retried(exc):
                    with self._cond:
                        if self._abandoned:
                            return
                        self._cond.wait(self._backoff.next())  # close() wakes it
                    continue
                log.error("state.db: a transaction could not be written and was dropped: %s (%s)", exc,
                          "; ".join(sql.split("(")[0].strip() for sql, _, _ in batch))
                return
            self._backoff.reset()
            return


class Recorder:
    """The connection a transaction's body sees: each statement runs on the in-memory copy, and the
    writes are kept, in order, for the file's writer."""

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self.statements: list[Statement] = []

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> sqlite3.Cursor:
        """Run ``sql`` in memory; keep it for the file when it writes."""
        cur = self._db.execute(sql, params)
        if writes(sql):
            self.statements.append((sql, _frozen(params), False))
        return cur

    def executemany(self, sql: str, seq: Iterable[Sequence[Any] | Mapping[str, Any]]) -> sqlite3.Cursor:
        """Run ``sql`` once per parameter set in memory; keep them for the file."""
        rows = [_frozen(p) for p in seq]
        cur = self._db.executemany(sql, rows)
        self.statements.append((sql, rows, True))
        return cur


def writes(sql: str) -> bool:
    """Whether a statement may change the database (a SELECT or PRAGMA read is not sent to the file)."""
    head = sql.lstrip().split(None, 1)
    return not head or head[0].upper() not in ("SELECT", "PRAGMA", "EXPLAIN")


def _frozen(params: Sequence[Any] | Mapping[str, Any]) -> tuple[Any, ...] | dict[str, Any]:
    """A copy of a statement's parameters (the caller may reuse its list before the writer runs)."""
    return dict(params) if isinstance(params, Mapping) else tuple(params)
