"""Issue 29: a 201 means it is on disk. :meth:`Store.acknowledged` waits (off the loop) until the block's
transactions are in ``state.db``; many waiting submissions share one file transaction (group commit); a
create the file cannot take (full: SQLite's ``max_page_count`` on the writer's own connection makes a
real SQLITE_FULL; locked past the bound: another connection's ``BEGIN IMMEDIATE``) is refused with
507/503 and taken back, from the file's queue and from memory, while writes not waited for stay queued.
The store reports the failure (``failure``) until a write lands again (docs/sidecar.md, "State on disk")."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3

import pytest

from xpufleet.common.errors import StoreError
from xpufleet.server.sidecar.store import Store
from xpufleet.server.sidecar.store_durable import StoreUnusable


def make_run(store: Store, name: str) -> str:
    return store.create_run(graph={"1": {"class_type": "X", "inputs": {}}}, options={}, target="local",
                            requested=["cpu"], candidates=[], queue_key="local/cpu", name=name)


def file_rows(path, sql: str) -> list[tuple]:
    """Rows of ``state.db`` as another process reads them."""
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [tuple(r) for r in db.execute(sql)]


@contextlib.contextmanager
def locked(path):
    """Another connection holding the file's write lock, as Optuna's thread or a second process may."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.close()


def big_run(store: Store, name: str) -> str:
    """A run whose graph fills several pages (so a file near its page limit cannot take it)."""
    return store.create_run(graph={"1": {"class_type": "X", "inputs": {"pad": "x" * 20000}}}, options={},
                            target="local", requested=["cpu"], candidates=[], queue_key="local/cpu", name=name)


def writer_db(store: Store) -> sqlite3.Connection:
    return store._writer._db  # the file's connection: max_page_count is a setting of one connection


async def test_an_acknowledged_create_is_in_the_file_when_the_block_ends(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    try:
        async with store.acknowledged():
            rid = await asyncio.to_thread(make_run, store, "durable")  # a worker thread's transaction counts
        assert file_rows(path, "SELECT id FROM runs") == [(rid,)]  # no flush: the file has it already
        assert store.failure is None
    finally:
        store.close()


async def test_many_waiting_creates_share_one_file_transaction(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    try:
        assert store.flush(10)

        async def submit(i: int) -> str:
            async with store.acknowledged():
                return make_run(store, f"r{i}")

        with locked(path) as holder:  # the writer waits on the lock while 100 creates queue up behind it
            tasks = [asyncio.create_task(submit(i)) for i in range(100)]
            await asyncio.sleep(0)
            assert store._writer.pending >= 100 and not any(t.done() for t in tasks)
            before = store._writer.commits
            holder.execute("ROLLBACK")
        ids = await asyncio.gather(*tasks)
        assert store._writer.commits - before <= 2  # one file transaction (and fsync) for the lot, not 100
        assert len(file_rows(path, "SELECT id FROM runs")) == 100 == len(set(ids))
    finally:
        store.close()


async def test_a_full_file_refuses_the_create_with_507_and_keeps_nothing_of_it(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    try:
        kept = make_run(store, "before")
        assert store.flush(10)
        pages = writer_db(store).execute("PRAGMA page_count").fetchone()[0]
        writer_db(store).execute(f"PRAGMA max_page_count={pages + 1}")  # the file can grow by one page only
        with pytest.raises(StoreError) as refused:
            async with store.acknowledged():
                rid = big_run(store, "too big")
        assert refused.value.status == 507 and "disk holding it is full" in refused.value.message
        assert store.get_run(rid) is None and store.get_run(kept) is not None  # taken back from memory
        assert store.failure is not None and store.failure.kind == "full"
        writer_db(store).execute("PRAGMA max_page_count=1073741823")  # space again
        async with store.acknowledged():
            later = big_run(store, "later")
        assert store.failure is None  # the store reports itself well once a write lands
        assert {r[0] for r in file_rows(path, "SELECT id FROM runs")} == {kept, later}
    finally:
        store.close()


async def test_a_lock_held_past_the_bound_refuses_the_create_with_503_and_keeps_other_writes(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    store._writer.ack_timeout_s = 0.5  # the bound (STORE_ACK_TIMEOUT_S), short for the test
    try:
        old = make_run(store, "old")
        assert store.flush(10)
        with locked(path):
            with pytest.raises(StoreError) as refused:
                async with store.acknowledged():
                    rid = make_run(store, "refused")
                    store.finish(old, "cancelled")  # the same block: refused with it
            assert refused.value.status == 503 and "write lock" in refused.value.message
            assert store.failure is not None and store.failure.kind == "locked"
            unwaited = make_run(store, "not waited for")  # no 201 hangs on it: it stays queued
            assert store.get_run(rid) is None and store.get_run(old)["status"] == "queued"
            assert store.get_run(unwaited) is not None
        assert store.flush(10)
        assert store.failure is None
        rows = dict(file_rows(path, "SELECT name, status FROM runs"))
        assert rows == {"old": "queued", "not waited for": "queued"}
    finally:
        store.close()


def test_a_damaged_file_is_refused_at_open_with_one_sentence(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    for i in range(60):
        big_run(store, f"r{i}")
    store.close()
    size = path.stat().st_size
    with open(path, "r+b") as fh:  # 8 KiB of noise in the middle, as a bad disk block would leave
        fh.seek(size // 2)
        fh.write(bytes(range(256)) * 32)
    with contextlib.closing(sqlite3.connect(path)) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] != "ok"
    with pytest.raises(StoreUnusable) as bad:
        Store(path)
    text = str(bad.value)
    assert "is damaged" in text and "quick_check" in text and "\n" not in text
    path.write_bytes(b"this is not a database at all" * 200)
    with pytest.raises(StoreUnusable, match="is damaged"):
        Store(path)
