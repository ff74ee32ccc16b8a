"""Issue 21, point 7: no synchronous SQLite on the event loop. Another connection (as Optuna's study
thread has) holds ``state.db``'s write lock for 3 s; meanwhile the sidecar cancels a run, records a canvas
run's events, answers reads that show them, and ``GET /api/health`` answers within 50 ms every time. A run
submitted under the lock is answered 201 only once the lock went and the run is in the file (issue 29: a
201 means it is on disk). Once the lock goes, every write made during it is in the file (docs/sidecar.md,
"State on disk").
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import threading
import time

import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.constants import STATE_DB_NAME
from xpufleet.server.sidecar.app import SidecarConfig, create_app
from xpufleet.server.sidecar.keys import DISPATCHER_KEY, LOCAL_PROVIDER_KEY, STORE_KEY

CPU = [{"name": "cpu", "kind": "cpu", "uuid": None, "total_gib": None}]
LOCK_S = 3.0
HEALTH_BOUND_S = 0.05
PROBES = 20


class WriteLock:
    """A second connection to ``state.db`` holding its write lock (``BEGIN EXCLUSIVE``) in a thread
    until :meth:`release`, as a study's Optuna storage does while it writes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.locked = threading.Event()
        self._release = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._hold, daemon=True)

    def _hold(self) -> None:
        try:
            with contextlib.closing(sqlite3.connect(self.path, isolation_level=None, timeout=10)) as db:
                db.execute("BEGIN EXCLUSIVE")
                db.execute("CREATE TABLE IF NOT EXISTS lock_probe (x)")  # a write of its own, rolled back
                self.locked.set()
                self._release.wait(60)  # bounded: the test releases it after LOCK_S
                db.execute("ROLLBACK")
        except BaseException as exc:  # reported by the test
            self.error = exc
            self.locked.set()

    def __enter__(self) -> WriteLock:
        self._thread.start()
        assert self.locked.wait(10) and self.error is None, self.error
        return self

    def release(self) -> None:
        self._release.set()
        self._thread.join(10)

    def __exit__(self, *exc: object) -> None:
        self.release()


def file_is_write_locked(path: str) -> bool:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None, timeout=0)) as db:
        try:
            db.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            assert "locked" in str(exc)
            return True
        db.execute("ROLLBACK")
        return False


async def test_a_held_write_lock_on_state_db_never_stalls_the_loop(tmp_path, aiohttp_client):
    config = SidecarConfig(home=tmp_path / "home", port=0, local_devices=CPU)
    app = create_app(config)
    client = await aiohttp_client(app)
    auth = {"Authorization": f"Bearer {config.token}"}
    store, dispatcher = app[STORE_KEY], app[DISPATCHER_KEY]
    path = str(config.home / STATE_DB_NAME)
    # the run submitted below stays queued (no process competes for the loop while it is measured)
    app[LOCAL_PROVIDER_KEY].draining = True
    dispatcher.providers_changed()
    assert (await client.get("/api/health")).status == 200
    assert await store.flushed(10)  # start-up's own writes are in the file before the lock

    # made before the lock: a queued run (cancelled under it) and a canvas run (its events come under it)
    resp = await client.post("/api/runs", json={"graph": harness.iris_graph(1), "options": {"name": "before"}}, headers=auth)
    assert resp.status == 201, await resp.text()
    run_id = (await resp.json())["run_id"]
    canvas = {"prompt_id": "p-1", "name": "canvas", "graph": harness.iris_graph(1), "comfy_pid": os.getpid()}
    resp = await client.post("/api/canvas/runs", json=canvas, headers=auth)
    assert resp.status == 201, await resp.text()
    canvas_id = (await resp.json())["id"]

    waits: list[float] = []
    with WriteLock(path) as lock:
        locked_at = time.monotonic()
        assert await asyncio.to_thread(file_is_write_locked, path)
        # a submission waits for the file (its 201 means it is on disk); the loop goes on meanwhile
        submit = asyncio.create_task(client.post(
            "/api/runs", json={"graph": harness.iris_graph(1), "options": {"name": "during"}}, headers=auth))
        for _ in range(3000):  # bounded: until its checks are done and it waits on the file (no CPU of its own)
            if store.list_runs(name="during")[1] == 1:
                break
            await asyncio.sleep(0.01)
        assert store.list_runs(name="during")[1] == 1 and not submit.done()
        resp = await client.post(f"/api/runs/{run_id}/cancel", headers=auth)
        assert resp.status == 200, await resp.text()
        events = [{"type": "metric", "payload": {"name": "train_loss_batch", "value": 1.0 / k, "step": k},
                   "ts": float(k), "seq": k} for k in range(1, 6)]
        resp = await client.post(f"/api/canvas/runs/{canvas_id}/events", json={"events": events}, headers=auth)
        assert (await resp.json())["stored"] == 5
        # reads see those writes at once; the file has none of them yet
        got = await (await client.get(f"/api/runs/{run_id}", headers=auth)).json()
        assert got["status"] == "cancelled"
        page = await (await client.get(f"/api/runs/{canvas_id}/events", headers=auth)).json()
        assert [e["cursor"] for e in page["events"]] == [1, 2, 3, 4, 5, 6]
        assert not store.flush(0)
        # health, sampled across the lock's whole span (at least PROBES times, each while it is held)
        for _ in range(10 * PROBES):  # bounded
            if len(waits) >= PROBES and time.monotonic() - locked_at >= LOCK_S:
                break
            started = time.perf_counter()
            resp = await client.get("/api/health")
            waits.append(time.perf_counter() - started)
            assert resp.status == 200
            await asyncio.sleep(LOCK_S / PROBES)  # spreads the probes over the lock's span
        assert time.monotonic() - locked_at >= LOCK_S and lock.error is None
        assert await asyncio.to_thread(file_is_write_locked, path)  # every probe above ran under the lock
        assert not submit.done()  # no 201 while the file could not take the run
    assert len(waits) >= PROBES
    assert max(waits) < HEALTH_BOUND_S, f"GET /api/health waited {max(waits) * 1000:.0f} ms under the lock"
    resp = await submit
    assert resp.status == 201, await resp.text()
    during = (await resp.json())["run_id"]
    with contextlib.closing(sqlite3.connect(path)) as db:  # on disk when answered, before any flush
        assert db.execute("SELECT name FROM runs WHERE id=?", (during,)).fetchall() == [("during",)]

    assert await store.flushed(10)
    with contextlib.closing(sqlite3.connect(path)) as db:
        runs = dict(db.execute("SELECT id, status FROM runs WHERE id IN (?, ?)", (run_id, canvas_id)).fetchall())
        assert runs == {run_id: "cancelled", canvas_id: "running"}
        cursors = [r[0] for r in db.execute("SELECT cursor FROM events WHERE run_id=? ORDER BY cursor", (canvas_id,))]
        assert cursors == [1, 2, 3, 4, 5, 6]
        kinds = [r[0] for r in db.execute("SELECT type FROM events WHERE run_id=? ORDER BY cursor", (run_id,))]
        assert kinds[0] == "status" and kinds[-1] == "run_finished"
