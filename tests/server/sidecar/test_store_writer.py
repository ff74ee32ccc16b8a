"""The store's one writer of ``state.db``: committed transactions reach the file in order, each whole;
a locked file is waited for off the caller's thread; close writes the queue (bounded); an error a retry
cannot mend drops that transaction only (docs/sidecar.md, "State on disk")."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading

import pytest

from xpufleet.server.sidecar import store_writer
from xpufleet.server.sidecar.store import Store
from xpufleet.server.sidecar.store_writer import DiskWriter, retried


def make_run(store: Store, name: str) -> str:
    return store.create_run(graph={"1": {"class_type": "X", "inputs": {}}}, options={"name": name}, target="local",
                            requested=["cpu"], candidates=[{"provider": "local", "devices": ["cpu"]}],
                            queue_key="local/cpu", name=name)


def file_rows(path, sql: str, params=()) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(path)) as db:
        return [tuple(r) for r in db.execute(sql, params)]


@contextlib.contextmanager
def locked(path):
    """Another connection holding the file's write lock (as Optuna's thread may), once the store's own
    start-up writes (the schema) are in the file."""
    db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    db.execute("BEGIN IMMEDIATE")
    try:
        yield db
    finally:
        if db.in_transaction:
            db.execute("ROLLBACK")
        db.close()


def test_writes_reach_the_file_in_commit_order_and_reads_see_them_before(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    try:
        assert store.flush(10)
        with locked(path):
            ids = [make_run(store, f"r{i}") for i in range(5)]
            store.finish(ids[2], "cancelled")
            # the caller did not wait on the lock; its reads already see every write
            assert [r["name"] for r in store.list_runs()[0]] == ["r4", "r3", "r2", "r1", "r0"]
            assert store.get_run(ids[2])["status"] == "cancelled"
            assert not store.flush(0.2)  # none of it is in the file yet
            assert file_rows(path, "SELECT COUNT(*) FROM runs") == [(0,)]
        assert store.flush(10)
        assert file_rows(path, "SELECT name, status FROM runs ORDER BY seq") == [
            ("r0", "queued"), ("r1", "queued"), ("r2", "cancelled"), ("r3", "queued"), ("r4", "queued")]
        assert file_rows(path, "SELECT cursor, type FROM events WHERE run_id=? ORDER BY cursor", (ids[2],)) == [
            (1, "status"), (2, "run_finished")]
    finally:
        store.close()


def test_a_rolled_back_transaction_sends_nothing_to_the_file(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    rid = make_run(store, "kept")
    with pytest.raises(RuntimeError), store.transaction() as db:
        db.execute("UPDATE runs SET name='half' WHERE id=?", (rid,))
        raise RuntimeError("boom")
    assert store.close()
    assert file_rows(path, "SELECT name FROM runs") == [("kept",)]


def test_close_waits_for_a_lock_to_go_and_writes_the_queue(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    assert store.flush(10)
    with locked(path) as holder:
        rid = make_run(store, "late")
        timer = threading.Timer(0.5, holder.execute, ("ROLLBACK",))  # the other side lets go while close waits
        timer.start()
        try:
            assert store.close(timeout=10)
        finally:
            timer.join()
    assert file_rows(path, "SELECT id FROM runs") == [(rid,)]


@pytest.fixture
def store_log(caplog):
    """The records of the store writer's own logger object, whatever earlier tests did to the logging tree
    (an in-process sidecar gives the package logger a file and turns its propagation off)."""
    logger = store_writer.log
    saved = (logger.level, logger.disabled, logging.root.manager.disable)
    logger.addHandler(caplog.handler)
    logger.disabled = False
    logging.disable(logging.NOTSET)
    logger.setLevel(logging.ERROR)
    caplog.handler.setLevel(logging.ERROR)
    yield caplog
    logger.removeHandler(caplog.handler)
    logger.setLevel(saved[0])
    logger.disabled = saved[1]
    logging.disable(saved[2])


def test_close_gives_up_after_its_timeout_when_the_file_stays_locked(tmp_path, store_log):
    path = tmp_path / "state.db"
    store = Store(path)
    assert store.flush(10)
    with locked(path):
        make_run(store, "lost")
        assert store.close(timeout=0.3) is False
    assert "transactions not written at shutdown" in store_log.text
    assert file_rows(path, "SELECT COUNT(*) FROM runs") == [(0,)]


def test_a_transaction_the_file_refuses_is_dropped_and_later_ones_still_land(tmp_path, store_log):
    path = tmp_path / "state.db"
    store = Store(path)
    try:
        store.ensure_schema("extra", "CREATE TABLE IF NOT EXISTS extra (x INTEGER)")
        assert store.flush(10)
        with contextlib.closing(sqlite3.connect(path)) as other:  # the file changed behind the store's back
            other.execute("DROP TABLE extra")
            other.commit()
        with store.transaction() as db:
            db.execute("INSERT INTO extra VALUES (1)")
        rid = make_run(store, "after")
        assert store.flush(10)
        assert "could not be written and was dropped" in store_log.text and "no such table" in store_log.text
        assert file_rows(path, "SELECT id FROM runs") == [(rid,)]
    finally:
        store.close()


def test_executemany_and_reads_inside_a_transaction(tmp_path):
    path = tmp_path / "state.db"
    store = Store(path)
    ids = [make_run(store, f"r{i}") for i in range(3)]
    store.set_waiting_reasons({ids[0]: "busy", ids[2]: "full"})  # executemany
    assert store.query("SELECT COUNT(*) FROM runs")[0][0] == 3
    store.close()
    assert file_rows(path, "SELECT waiting_reason FROM runs ORDER BY seq") == [("busy",), (None,), ("full",)]


def test_only_a_locked_busy_full_or_io_failure_is_retried():
    def error(code: int) -> sqlite3.OperationalError:
        exc = sqlite3.OperationalError("x")
        exc.sqlite_errorcode = code
        return exc

    assert retried(error(sqlite3.SQLITE_BUSY)) and retried(error(sqlite3.SQLITE_LOCKED))
    assert retried(error(sqlite3.SQLITE_FULL)) and retried(error(sqlite3.SQLITE_IOERR_WRITE))  # extended code
    assert not retried(error(sqlite3.SQLITE_ERROR)) and not retried(sqlite3.OperationalError("no code"))


def test_a_closed_writer_takes_no_more(tmp_path):
    writer = DiskWriter(tmp_path / "w.db")
    writer.start()
    assert writer.close(1)
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit([("CREATE TABLE t (x)", (), False)])
