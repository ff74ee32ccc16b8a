"""The one writer of ``state.db`` (docs/sidecar.md, "State on disk").

The store answers every call from an in-memory copy of the database (never locked by anyone else) and
hands each committed transaction's statements here. One thread owns the file's connection and applies
them in commit order, so the event loop never waits on SQLite's write lock: Optuna's thread, or any other
process, may hold it for seconds and only this thread waits.

Group commit: every transaction queued while the previous file transaction ran goes into the next one
(up to ``STORE_GROUP_MAX``), so many submissions share one commit and one fsync. A transaction whose
caller waits for it (a create that answers 201) carries an ``on_done`` callback, called from this thread
once the file transaction holding it is committed, or with a :class:`WriteFailure` when the file cannot
take it: the disk is full (at once) or another connection held the lock past ``STORE_ACK_TIMEOUT_S``.
Such a transaction is then taken back: it leaves the queue and the store rebuilds its in-memory copy
from the file plus the transactions still queued, so what was refused is neither on disk nor in memory.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import itertools
import logging
import shutil
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...common.backoff import Backoff
from ...constants import STORE_ACK_TIMEOUT_S, STORE_BUSY_TIMEOUT_S, STORE_GROUP_MAX

log = logging.getLogger("xpufleet.store")

# (sql, parameters, many): one statement of a committed transaction, as the store ran it in memory
Statement = tuple[str, Any, bool]
Batch = tuple[Statement, ...]

# a batch that failed with one of these is tried again (the file is locked or full, the disk hiccuped);
# any other error cannot succeed on a retry and would hold up every later batch
_RETRIED = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR})
_LOCKED = frozenset({sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED})
_ROOM_BYTES = 1 << 20  # less free space than this under state.db's folder: an I/O error there is a full disk
# a write the file-only probe makes while the store is failing and nothing else is queued (is it back?)
_PROBE = ("CREATE TABLE IF NOT EXISTS store_probe (at REAL)", "DELETE FROM store_probe",
          "INSERT INTO store_probe VALUES (julianday('now'))")


def retried(exc: sqlite3.Error) -> bool:
    """Whether a failed batch is tried again: the file was busy, locked, full or had an I/O error."""
    code = getattr(exc, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in _RETRIED


@dataclass(frozen=True)
class WriteFailure:
    """Why ``state.db`` is not taking writes now: ``kind`` is ``full``, ``locked`` or ``io``."""

    kind: str
    text: str  # one sentence for an answer or a health check
    since: float  # time.monotonic() of the first failed attempt

    @property
    def status(self) -> int:
        """The HTTP answer to a create it refused: 507 Insufficient Storage for a full disk, else 503."""
        return 507 if self.kind == "full" else 503


def failure_of(exc: BaseException, since: float, ack_timeout_s: float = STORE_ACK_TIMEOUT_S,
               path: Path | None = None) -> WriteFailure:
    """The :class:`WriteFailure` an exception from the file means (an I/O error on a disk with no room
    left is a full disk: SQLite reports a failed write of the WAL that way)."""
    code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
    if code == sqlite3.SQLITE_FULL or getattr(exc, "errno", None) == errno.ENOSPC or (
            code == sqlite3.SQLITE_IOERR and path is not None and no_room(path)):
        return WriteFailure("full", f"state.db cannot be written: the disk holding it is full ({exc})", since)
    if code in _LOCKED:
        return WriteFailure("locked", f"state.db cannot be written: another connection has held its write lock "
                                      f"for more than {ack_timeout_s:g} s ({exc})", since)
    return WriteFailure("io", f"state.db cannot be written: {exc}", since)


def no_room(path: Path) -> bool:
    """Whether the disk holding ``path`` has (next to) no free space left."""
    try:
        return shutil.disk_usage(path.parent).free < _ROOM_BYTES
    except OSError:
        return False


OnDone = Callable[[WriteFailure | None], None]


@dataclass
class _Pending:
    batch: Batch
    on_done: OnDone | None  # set when a caller waits for this batch to be in the file


class DiskWriter:
    """The thread that owns ``state.db``'s connection: :meth:`submit` queues a batch, applied in order."""

    def __init__(self, path: Path, *, busy_timeout_s: float = STORE_BUSY_TIMEOUT_S,
                 retry_first_s: float = 0.05, retry_max_s: float = 2.0,
                 ack_timeout_s: float = STORE_ACK_TIMEOUT_S, group_max: int = STORE_GROUP_MAX) -> None:
        self.path = path
        self.ack_timeout_s = ack_timeout_s
        self._group_max = group_max
        self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        self._db.execute(f"PRAGMA busy_timeout={int(busy_timeout_s * 1000)}")
        self._db.execute("PRAGMA journal_mode=WAL")  # readers of the file (CLI, Optuna) never block this writer
        # FULL: WAL commits are fsynced, so a 201 survives a power loss, not only a killed process; group
        # commit pays that fsync once per file transaction, not once per submission (docs/benchmarks.md).
        self._db.execute("PRAGMA synchronous=FULL")
        self._queue: collections.deque[_Pending] = collections.deque()
        self._cond = threading.Condition()
        self._closing = False
        self._abandoned = False  # close() gave up waiting: the retrying batch and the queue are dropped
        self._backoff = Backoff(retry_first_s, retry_max_s)
        self._one_by_one = 0  # after an error no retry mends, the next batches go alone to find the bad one
        self.failure: WriteFailure | None = None  # set while the file refuses writes; None once one lands
        self.commits = 0  # file transactions committed (each holds one or many batches: group commit)
        # the store's lock and its rebuild (memory := file + the given batches), for taking batches back
        self._guard: Any = contextlib.nullcontext()
        self._rebuild: Callable[[list[Batch]], None] | None = None
        self._thread = threading.Thread(target=self._run, name="xpufleet-store-writer", daemon=True)

    def check(self) -> str | None:
        """``PRAGMA quick_check`` of the file: None when sound, else SQLite's first complaint."""
        rows = self._db.execute("PRAGMA quick_check(1)").fetchall()
        first = " ".join(str(rows[0][0]).replace("*** in database main ***", "").split()) if rows else "no answer"
        return None if first == "ok" else first

    def copy_to(self, target: sqlite3.Connection) -> None:
        """Copy the file's committed content into ``target`` (before :meth:`start`, or in a rebuild)."""
        self._db.backup(target)

    def bind(self, guard: Any, rebuild: Callable[[list[Batch]], None]) -> None:
        """The store's lock (held around a take-back) and its rebuild of the in-memory copy."""
        self._guard, self._rebuild = guard, rebuild

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    @property
    def pending(self) -> int:
        """Batches not written yet (the one being written included)."""
        with self._cond:
            return len(self._queue)

    def submit(self, batch: Sequence[Statement], on_done: OnDone | None = None) -> None:
        """Queue one committed transaction's statements; they reach the file after every earlier batch.
        ``on_done(None)`` once they are in the file, ``on_done(failure)`` when they were taken back."""
        if not batch:
            if on_done is not None:
                on_done(None)
            return
        with self._cond:
            if self._closing:
                raise RuntimeError("the store is closed")
            self._queue.append(_Pending(tuple(batch), on_done))
            self._cond.notify_all()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every batch submitted so far is written (or dropped); False on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue, timeout)

    def settle(self, timeout: float | None = None) -> bool:
        """Wait until the queue is written or the file refuses it (full, I/O error); True when written."""
        with self._cond:
            self._cond.wait_for(lambda: not self._queue or (self.failure is not None and self.failure.kind != "locked"),
                                timeout)
            return not self._queue

    def probe(self) -> None:
        """Queue a small write of the file's own (a table only the file has): does it take writes?"""
        self.submit([(sql, (), False) for sql in _PROBE])

    def close(self, timeout: float | None) -> bool:
        """Write the queue (up to ``timeout`` s), stop the thread and close the file. False when batches
        were left unwritten (logged with their count)."""
        drained = self.flush(timeout) if self._thread.is_alive() else not self._queue
        with self._cond:
            self._closing = True
            left = list(self._queue)
            if not drained:
                self._abandoned = True
                log.error("state.db: %d transactions not written at shutdown (%s)", len(left),
                          self.failure.text if self.failure else "the file stayed locked or full")
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(STORE_BUSY_TIMEOUT_S + 5.0)
        if not drained:
            gone = WriteFailure("io", "the server stopped before state.db took this write", time.monotonic())
            _tell([p for p in left if p.on_done], gone)
        self._db.close()
        return drained

    # --- the thread ----------------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing,
                                    None if self.failure is None else self._backoff.next())
                if self._abandoned or (self._closing and not self._queue):
                    self._queue.clear()
                    self._cond.notify_all()
                    return
                size = 1 if self._one_by_one else self._group_max
                group = list(itertools.islice(self._queue, size))
            if not group:  # failing with nothing queued: a probe write tells when the file is back
                self._attempt([(sql, (), False) for sql in _PROBE])
                with self._cond:
                    self._cond.notify_all()
                continue
            exc = self._attempt([s for p in group for s in p.batch])
            if exc is None:
                with self._cond:
                    for _ in group:
                        self._queue.popleft()
                    self._one_by_one = max(0, self._one_by_one - len(group))
                    self._cond.notify_all()
                _tell([p for p in group if p.on_done], None)
            elif isinstance(exc, sqlite3.Error) and retried(exc):
                failure = self.failure
                assert failure is not None
                if failure.kind != "locked" or time.monotonic() - failure.since >= self.ack_timeout_s:
                    self._take_back(lambda p: p.on_done is not None, failure)
                with self._cond:
                    self._cond.notify_all()  # settle() waits for a failure too
                    if not self._abandoned:
                        self._cond.wait(self._backoff.next())  # close() wakes it
            elif len(group) > 1:
                self._one_by_one = len(group)  # write them alone to find the one the file refuses
            else:
                log.error("state.db: a transaction could not be written and was dropped: %s (%s)", exc,
                          "; ".join(sql.split("(")[0].strip() for sql, _, _ in group[0].batch))
                if group[0].on_done is not None:  # a waiting create: refused, and gone from memory too
                    bad = WriteFailure("io", f"state.db cannot take this write: {exc}", time.monotonic())
                    self._take_back(lambda p, bad_one=group[0]: p is bad_one, bad)
                else:
                    with self._cond:
                        self._queue.popleft()
                        self._cond.notify_all()
                self._one_by_one = max(0, self._one_by_one - 1)

    def _attempt(self, statements: list[Statement]) -> BaseException | None:
        """One file transaction; None when committed (and the failure state cleared), else the error."""
        started = time.monotonic()
        try:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params, many in statements:
                    (self._db.executemany if many else self._db.execute)(sql, params)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        self._db.execute("ROLLBACK")
                raise
        except Exception as exc:  # the thread must live on: a dead writer would hold every later batch
            if isinstance(exc, sqlite3.Error) and retried(exc):
                since = self.failure.since if self.failure is not None else started
                if self.failure is None:
                    log.error("state.db: writes fail, retrying: %s", exc)
                self.failure = failure_of(exc, since, self.ack_timeout_s, self.path)
            return exc
        self.commits += 1
        if self.failure is not None:
            log.warning("state.db: writes land again")
        self.failure = None
        self._backoff.reset()
        return None

    def _take_back(self, which: Callable[[_Pending], bool], failure: WriteFailure) -> None:
        """Take the queued batches ``which`` selects out of the queue, rebuild the store's in-memory copy
        from the file and the batches left, and tell their callers ``failure``."""
        with self._guard:  # the store's lock: no transaction runs in memory meanwhile
            with self._cond:
                taken = [p for p in self._queue if which(p)]
                if not taken:
                    return
                self._queue = collections.deque(p for p in self._queue if not which(p))
                kept = [p.batch for p in self._queue]
                self._cond.notify_all()
            if self._rebuild is not None:
                self._rebuild(kept)
        log.error("state.db: %d acknowledged writes refused and taken back: %s", len(taken), failure.text)
        _tell(taken, failure)


def _tell(pending: Iterable[_Pending], failure: WriteFailure | None) -> None:
    for p in pending:
        assert p.on_done is not None
        try:
            p.on_done(failure)
        except Exception:  # noqa: BLE001 - a caller's callback must not stop the writer
            log.exception("state.db: a write's callback failed")


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
