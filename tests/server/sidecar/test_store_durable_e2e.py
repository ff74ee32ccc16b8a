"""Issue 29, "a 201 means it is on disk", with a real sidecar process: kill -9 right after a 1,000-variant
sweep's 201 (0 s, 0.1 s, 1 s later) and during a burst of 500 submissions while another process holds
``state.db``'s write lock; every acknowledged run id is there after the restart, and none twice. A lock
held past the bound is a 503, never a 201, and health says so until writes land again. On a full disk (a
real 8 MiB tmpfs as XPUFLEET_HOME) there is no 201 for what was not written, and nothing refused comes
back after space is freed. A start on a full disk or on a damaged state.db exits 1 with one sentence
(docs/sidecar.md, "State on disk")."""

from __future__ import annotations

import collections
import contextlib
import errno
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import sidecar_harness as harness  # registered by tests/server/conftest.py

from xpufleet.common.client import Client, SidecarUnreachable
from xpufleet.constants import STATE_DB_NAME, STORE_ACK_TIMEOUT_S

pytestmark = pytest.mark.e2e

GRAPH = json.loads((Path(__file__).resolve().parents[3] / "samples" / "mlp_digits.json").read_text())
POOL = {"pool": "spot"}  # a pool with no instance: its runs wait (nothing trains)
# a second process holding state.db's write lock until a line arrives on its stdin
LOCKER = """
import sqlite3, sys
db = sqlite3.connect(sys.argv[1], isolation_level=None, timeout=30)
db.execute("BEGIN EXCLUSIVE")
db.execute("CREATE TABLE IF NOT EXISTS lock_probe (x)")
print("locked", flush=True)
sys.stdin.readline()
db.execute("ROLLBACK")
print("released", flush=True)
"""


def sweep_body(variants: int) -> dict[str, Any]:
    return {"name": "durable", "graph": GRAPH, "objective": {"metric": "val_accuracy"},
            "parameters": {"5.lr": {"low": 1e-5, "high": 0.3, "log": True, "steps": variants // 4}},
            "seeds": 4, "set": {"10.location": "run_dir"}, "options": {"target": POOL}, "max_runs": variants}


def patient(sc: harness.Sidecar) -> Client:
    """A client that waits long for an answer (a 1,000-variant sweep on a loaded machine)."""
    assert sc.info is not None
    return Client(sc.url, sc.info["token"], timeout=300)


def run_body(i: int) -> dict[str, Any]:
    return {"graph": GRAPH, "options": {"name": f"burst-{i}", "target": POOL}}


def started(home: Path) -> harness.Sidecar:
    sc = harness.Sidecar(home).start()
    assert sc.client is not None
    sc.client.request("POST", "/api/pools", {"name": "spot"})
    return sc


def stored_run_ids(sc: harness.Sidecar) -> list[str]:
    """Every run id the (restarted) sidecar lists, duplicates kept."""
    assert sc.client is not None
    ids: list[str] = []
    for offset in range(0, 100_000, 1000):  # bounded
        page = sc.client.request("GET", "/api/runs", params={"limit": 1000, "offset": offset})
        ids += [r["id"] for r in page["runs"]]
        if offset + 1000 >= page["total"]:
            return ids
    raise AssertionError("more runs than expected")


def assert_all_there_once(sc: harness.Sidecar, acked: list[str]) -> list[str]:
    ids = stored_run_ids(sc)
    twice = [i for i, n in collections.Counter(ids).items() if n > 1]
    assert not twice, f"{len(twice)} run ids listed twice"
    missing = set(acked) - set(ids)
    assert not missing, f"{len(missing)} of {len(acked)} acknowledged runs lost"
    return ids


def health(sc: harness.Sidecar) -> dict[str, Any]:
    assert sc.client is not None
    return sc.client.health()


class Locker:
    """A second process holding ``state.db``'s write lock (``BEGIN EXCLUSIVE``) until :meth:`release`."""

    def __init__(self, db: Path) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", LOCKER, str(db)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "locked"

    def release(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write("go\n")
            self.proc.stdin.flush()
            assert self.proc.stdout.readline().strip() == "released"
            self.proc.wait(30)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.release()
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


class Burst:
    """``n`` submissions of a run from ``workers`` threads; what each got is kept."""

    def __init__(self, sc: harness.Sidecar, n: int, workers: int = 8) -> None:
        self.client = patient(sc)
        self.sent = 0
        self.acked: list[str] = []
        self.refused: list[tuple[int, str]] = []
        self.lost = 0  # no answer: the sidecar was killed under it
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(workers)
        self._futures = [self._pool.submit(self._one, i) for i in range(n)]

    def _one(self, i: int) -> None:
        with self._lock:
            self.sent += 1
        try:
            status, answer = self.client.call("POST", "/api/runs", run_body(i), timeout=120)
        except SidecarUnreachable:
            with self._lock:
                self.lost += 1
            return
        with self._lock:
            if status == 201:
                self.acked.append(answer["run_id"])
            else:
                self.refused.append((status, answer.get("error", "") if isinstance(answer, dict) else str(answer)))

    def count(self) -> int:
        with self._lock:
            return len(self.acked)

    def finish(self) -> None:
        for f in self._futures:
            f.result(180)
        self._pool.shutdown()


@pytest.mark.parametrize("delay_s", [0.0, 0.1, 1.0])
def test_kill_9_after_a_sweeps_201_keeps_every_run(tmp_path, delay_s):
    sc = started(tmp_path / "home")
    try:
        assert sc.client is not None
        answer = patient(sc).request("POST", "/api/sweeps", sweep_body(1000))
        if delay_s:
            time.sleep(delay_s)  # the moment of the crash after the 201: the scenario, not a wait for a state
        sc.kill9()
        acked = answer["run_ids"]
        assert len(set(acked)) == 1000
        sc.start()
        ids = assert_all_there_once(sc, acked)
        assert len(ids) == 1000
        sweep = sc.client.request("GET", f"/api/sweeps/{answer['sweep_id']}")
        assert sweep["n_runs"] == 1000
    finally:
        sc.stop()


def test_kill_9_during_a_burst_under_another_process_write_lock_keeps_every_acknowledged_run(tmp_path):
    sc = started(tmp_path / "home")
    locker = Locker(sc.home / STATE_DB_NAME)
    burst = None
    try:
        burst = Burst(sc, 500)
        harness.wait_until(lambda: burst.sent >= 16, "16 submissions in flight", 60)
        assert burst.count() == 0, "a run was answered 201 while state.db was locked"
        locker.release()
        harness.wait_until(lambda: burst.count() >= 100, "100 runs acknowledged", 120)
        sc.kill9()  # in the middle of the burst
        burst.finish()
        acked = list(burst.acked)
        assert len(acked) >= 100 and burst.lost + len(acked) + len(burst.refused) == 500
        sc.start()
        ids = assert_all_there_once(sc, acked)
        # nothing refused or unanswered was kept beyond what the file took before the kill
        assert len(ids) <= 500
    finally:
        locker.close()
        if burst is not None:
            with contextlib.suppress(Exception):
                burst.finish()
        sc.stop()


def test_a_lock_held_past_the_bound_is_a_503_and_health_says_so_until_writes_land(tmp_path):
    sc = started(tmp_path / "home")
    locker = Locker(sc.home / STATE_DB_NAME)
    try:
        assert sc.client is not None
        burst = Burst(sc, 5, workers=5)
        harness.wait_until(lambda: not health(sc)["store"]["ok"], "health: the store is failing",
                           STORE_ACK_TIMEOUT_S + 60)
        burst.finish()  # each waited for the bound, then was refused
        assert burst.acked == [] and len(burst.refused) == 5
        assert all(status == 503 and "write lock" in text for status, text in burst.refused), burst.refused
        state = health(sc)
        assert state["status"] == "degraded" and "write lock" in state["store"]["error"]
        locker.release()
        harness.wait_until(lambda: health(sc)["store"]["ok"], "health: the store is ok again", 60)
        kept = sc.client.request("POST", "/api/runs", run_body(99))["run_id"]
        sc.stop()
        sc.start()
        assert stored_run_ids(sc) == [kept]  # none of the refused five came back
    finally:
        locker.close()
        sc.stop()


@pytest.fixture
def tmpfs(tmp_path):
    """An 8 MiB tmpfs (a disk that fills up for real); skipped where mounting is refused (needs root)."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True,
                          text=True, check=False) if shutil.which("mount") else None
    if proc is None or proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() if proc else 'no mount'}); "
                    f"tests/server/sidecar/test_store_ack.py fills a file with PRAGMA max_page_count instead")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True, check=False)


def fill(path: Path) -> None:
    """Write ``path`` until the disk has no room left."""
    for size in (64 << 10, 512):  # big writes, then the last partial block
        try:
            with open(path, "ab") as fh:
                for _ in range(100_000):  # bounded: a tmpfs of a few MiB fills long before
                    fh.write(b"\0" * size)
                    fh.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def one_sentence(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert len(lines) == 1, lines
    return lines[0]


def test_a_full_disk_gets_no_201_for_what_was_not_written(tmpfs):
    home = tmpfs / "home"
    sc = started(home)
    filler = tmpfs / "filler"
    try:
        assert sc.client is not None
        fill(filler)
        burst = Burst(sc, 400)
        burst.finish()
        assert burst.lost == 0
        refused = collections.Counter(status for status, _ in burst.refused)
        assert refused[507] > 0 and set(refused) <= {507}, burst.refused[:3]
        assert all("full" in text for _, text in burst.refused)
        assert not health(sc)["store"]["ok"]
        acked = list(burst.acked)
        os.unlink(filler)
        harness.wait_until(lambda: health(sc)["store"]["ok"], "health: the store is ok again", 60)
        late = sc.client.request("POST", "/api/runs", run_body(400))["run_id"]
        sc.kill9()
        sc.start()
        ids = assert_all_there_once(sc, [*acked, late])
        assert sorted(ids) == sorted([*acked, late])  # no refused run came back once space was there
        sc.kill9()
        fill(filler)  # a start on the full disk: one sentence, exit 1
        proc = sc.cli("start", "--port", "0", timeout=120)
        assert proc.returncode == 1 and "full" in one_sentence(proc)
    finally:
        sc.stop()


def test_a_damaged_state_db_stops_start_up_with_one_sentence(tmp_path):
    sc = started(tmp_path / "home")
    try:
        assert sc.client is not None
        patient(sc).request("POST", "/api/sweeps", sweep_body(200))
    finally:
        sc.stop()
    db = sc.home / STATE_DB_NAME
    size = db.stat().st_size
    with open(db, "r+b") as fh:  # 8 KiB of random bytes in the middle, as in the probe
        fh.seek(size // 2)
        fh.write(os.urandom(8192))
    assert not _passes_integrity_check(db)  # the damage is real: SQLite itself says so
    proc = sc.cli("start", "--port", "0", timeout=120)
    assert proc.returncode == 1
    assert "is damaged" in one_sentence(proc)


def _passes_integrity_check(db: Path) -> bool:
    """SQLite's own verdict. Random bytes may land in a page SQLite reads before it can answer, and then
    the check raises "database disk image is malformed" instead of listing what is wrong."""
    try:
        with contextlib.closing(sqlite3.connect(db)) as check:
            return check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    except sqlite3.DatabaseError:
        return False
