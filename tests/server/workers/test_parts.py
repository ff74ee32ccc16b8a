"""The registry's parts on their own (docs/workers.md, "The registry's parts"): each is made from what it is given,
with a real store and no dispatcher where it needs none."""

from __future__ import annotations

import time
from typing import Any

import pytest

from xpufleet.server.sidecar.store import Store
from xpufleet.server.workers.pools import PoolDirectory
from xpufleet.server.workers.records import REJECTIONS_KEPT, Rejections
from xpufleet.server.workers.state import ServerLinks, WorkerError, WorkerState
from xpufleet.server.workers.table import WorkerTable


class _Open:
    """A connection that is up (what ``WorkerState.online`` asks)."""

    closed = False


@pytest.fixture
def table(tmp_path) -> WorkerTable:
    store = Store(tmp_path / "state.db")
    yield WorkerTable(store)
    store.close()


def _pool(table: WorkerTable, name: str, revoked: bool = False) -> None:
    with table.store.transaction() as db:
        db.execute("INSERT INTO worker_pools(name, credential_hash, created_at, revoked_at) VALUES (?,?,?,?)",
                   (name, "h", time.time(), time.time() if revoked else None))


def test_the_table_loads_the_workers_and_a_cards_mode(tmp_path):
    store = Store(tmp_path / "state.db")
    try:
        first = WorkerTable(store)
        with store.transaction() as db:
            db.execute("INSERT INTO workers(name, auth, created_at) VALUES ('box', 'session', 1.0)")
            db.execute("INSERT INTO worker_device_modes(worker, device, mode, updated_at) VALUES"
                       " ('box', 'cuda:1', 'shared', 1.0)")
        assert first.workers == {}  # loaded once, when it is made
        table = WorkerTable(store)
        assert list(table.workers) == ["box"] and table.get("box").auth == "session"
        assert table.device_mode("box", "cuda:1") == "shared"
        assert table.device_mode("box", "cuda:0") == "exclusive"  # the default
        with pytest.raises(WorkerError, match="no worker named 'nobody'") as err:
            table.get("nobody")
        assert err.value.status == 404
    finally:
        store.close()


def test_the_directory_is_the_dispatchers_pool_view_and_says_why_a_pool_run_waits(table):
    directory = PoolDirectory(table)
    assert directory.live() == {} and directory.closed() == {}
    _pool(table, "spot")
    _pool(table, "old", revoked=True)
    busy = WorkerState(name="i1", pool="spot", one_shot=True, taken="run-1", conn=_Open())
    gone = WorkerState(name="i2", pool="spot", one_shot=True)
    table.workers.update({"i1": busy, "i2": gone})
    directory.refresh()  # what the dispatcher reads next (PoolsView: sidecar/pool_table.py)
    live, closed = directory.live(), directory.closed()
    assert live == {"old": [], "spot": ["i1"]}
    assert list(closed) == ["old"] and "revoked" in closed["old"]
    assert directory.waiting_reason("spot").startswith("waiting for an idle instance of pool spot (1 connected")
    assert directory.waiting_reason("old").startswith("waiting for an instance of pool old to join; the pool's "
                                                      "credential is revoked")
    busy.taken = None  # an idle instance: the plan's own text says it
    assert directory.waiting_reason("spot") is None

    class Slurm:
        def reason(self, pool: str, run_id: Any) -> str:
            return f"slurm job for {pool}/{run_id} pending"

    directory.attach_slurm(Slurm())
    assert directory.waiting_reason("old", "r9") == "slurm job for old/r9 pending"


def test_rejections_keep_the_latest_of_each_and_a_bounded_list(table):
    rejections = Rejections(table.store)
    for _ in range(3):  # an agent retrying shows once
        rejections.record("a", "10.0.0.1", "1.0", "bad credential")
    for i in range(REJECTIONS_KEPT + 5):
        rejections.record(f"w{i}", None, None, "version mismatch")
    latest = rejections.latest(limit=REJECTIONS_KEPT + 50)
    assert len(latest) == REJECTIONS_KEPT  # the oldest ("a" among them) went out of the kept list
    assert latest[0]["name"] == f"w{REJECTIONS_KEPT + 4}"
    assert rejections.last_for("a") is None and rejections.last_for("w10")["reason"] == "version mismatch"


def test_server_links_default_node_types_and_a_broken_source():
    def broken() -> list[str]:
        raise ImportError("a node module failed")

    assert ServerLinks(session_token=lambda: "t", node_types=lambda: ["B", "A"]).server_node_types() == ["B", "A"]
    assert ServerLinks(session_token=lambda: "t", node_types=broken).server_node_types() == []
    assert "XPUDataset" in ServerLinks(session_token=lambda: None).server_node_types()
