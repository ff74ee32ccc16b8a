"""Opening ``state.db`` and waiting for it (docs/sidecar.md, "State on disk"): the start-up check that turns
a damaged file or a full disk into one sentence, and the acknowledgement a 201 waits on until the writer
thread (``store_writer.py``) has its transactions in the file. Used by ``store.py`` only."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import errno
import sqlite3
import threading
from pathlib import Path

from ...constants import STORE_FLUSH_ON_CLOSE_S
from .store_writer import DiskWriter, OnDone, WriteFailure, no_room


class StoreUnusable(OSError):
    """``state.db`` cannot be opened: damaged, on a full disk, unreadable. The message is one sentence."""


class Acknowledgement:
    """The transactions committed inside one :meth:`Store.acknowledged` block (in any thread its context
    reaches, ``asyncio.to_thread`` included), and whether the file has them all."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._added = 0
        self._settled = 0
        self._changed = asyncio.Event()
        self.failure: WriteFailure | None = None
        self.open = True  # closed when the block's body ends: a task it started later is not waited for

    def add(self) -> OnDone | None:
        """The callback of one more committed transaction (None once the block's body has ended)."""
        with self._lock:
            if not self.open:
                return None
            self._added += 1
        return self._done

    def _done(self, failure: WriteFailure | None) -> None:  # the writer's thread
        with contextlib.suppress(RuntimeError):  # the loop is gone: nobody waits any more
            self._loop.call_soon_threadsafe(self._settle, failure)

    def _settle(self, failure: WriteFailure | None) -> None:
        self._settled += 1
        if failure is not None and self.failure is None:
            self.failure = failure
        self._changed.set()

    async def wait(self) -> None:
        """Until the file has every transaction added (or one was refused)."""
        with self._lock:
            self.open = False
        while self._settled < self._added:
            self._changed.clear()
            await self._changed.wait()


CURRENT_ACK: contextvars.ContextVar[Acknowledgement | None] = contextvars.ContextVar("xpufleet_store_ack", default=None)


def open_state(path: Path) -> tuple[DiskWriter, sqlite3.Connection]:
    """The file's writer (``PRAGMA quick_check`` passed) and the in-memory copy of its content; a damaged
    file, a full disk or an unreadable file raises :class:`StoreUnusable` with one sentence."""
    writer = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        writer = DiskWriter(path)
        problem = writer.check()
        if problem is not None:
            raise StoreUnusable(f"{path} is damaged (SQLite's quick_check: {problem}): move it aside, or restore "
                                f"a backup, and start again (an empty state.db is made when none is there)")
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE ... COMMIT) in Store.transaction.
        db = sqlite3.connect(":memory:", isolation_level=None, check_same_thread=False)
        writer.copy_to(db)
        db.row_factory = sqlite3.Row
        return writer, db
    except StoreUnusable:
        _close_quietly(writer)
        raise
    except sqlite3.DatabaseError as exc:
        _close_quietly(writer)
        code = (getattr(exc, "sqlite_errorcode", None) or 0) & 0xFF
        if code in (sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT):
            raise StoreUnusable(f"{path} is damaged ({exc}): move it aside, or restore a backup, and start again "
                                f"(an empty state.db is made when none is there)") from None
        raise StoreUnusable(start_sentence(path, str(exc), no_room(path))) from None
    except OSError as exc:
        _close_quietly(writer)
        raise StoreUnusable(start_sentence(path, exc.strerror or str(exc),
                                            exc.errno == errno.ENOSPC or no_room(path))) from None


def probe_or_refuse(writer: DiskWriter, path: Path) -> None:
    """A probe write in the file before anything is served: a full disk (or a lock held past the bound)
    stops start-up with :class:`StoreUnusable` and one sentence."""
    writer.probe()
    if not writer.settle(STORE_FLUSH_ON_CLOSE_S):
        failure = writer.failure
        writer.close(0)
        raise StoreUnusable(start_sentence(path, failure.text if failure else "it stayed locked",
                                           failure is not None and failure.kind == "full" or no_room(path)))


def start_sentence(path: Path, why: str, full: bool = False) -> str:
    if full:
        return f"{path} cannot be written: the disk holding it is full; free some space and start again"
    return f"{path} cannot be opened for writing ({why}): check the folder's permissions and free space"


def _close_quietly(writer: DiskWriter | None) -> None:
    if writer is not None:
        with contextlib.suppress(Exception):
            writer.close(0)
