"""The SQLite store: run records, gapless event cursors, replays stored once, atomic writes."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from xpufleet.common.errors import StoreError
from xpufleet.server.run.events import NewEvent
from xpufleet.server.sidecar.store import Store


def make_run(store: Store, **kw) -> str:
    args = dict(graph={"1": {"class_type": "X", "inputs": {}}}, options={"name": "n"}, target="local",
                requested=["cpu"], candidates=[{"provider": "local", "devices": ["cpu"]}], queue_key="local/cpu")
    args.update(kw)
    return store.create_run(**args)


def cursors(store: Store, run_id: str) -> list[int]:
    return [e["cursor"] for e in store.events_after(run_id, 0, 10_000)]


def test_a_run_moves_through_its_statuses_with_a_gapless_event_log(store):
    warning = {"kind": "device_fallback", "message": "runs on cpu"}
    rid = make_run(store, name="first", warnings=[warning])
    run = store.get_run(rid)
    assert (run["status"], run["name"], run["warnings"], run["cursor"]) == ("queued", "first", [warning], 2)
    assert store.queued() == [(rid, [{"provider": "local", "devices": ["cpu"]}])]
    assert store.assign(rid, provider="local", placement="local", devices=["cpu"], run_dir="/tmp/x")
    assert not store.assign(rid, provider="local", placement="local", devices=["cpu"], run_dir="/tmp/x")
    assert store.mark_running(rid, pid=123)
    events = [NewEvent("run_started", {}, 1.0, 1), NewEvent("metric", {"name": "loss", "value": 0.5}, 2.0, 2),
              NewEvent("run_warning", {"kind": "k", "message": "m"}, 2.5, 3)]
    assert store.append_events(rid, events).stored == 3
    done = store.append_events(rid, [NewEvent("run_finished", {
        "status": "succeeded", "error": None, "final_metrics": {"loss": 0.5}, "peak_memory": {"measured": False},
        "execution_facts": {"visible_devices": ["cpu"]}}, 3.0, 4)])
    assert done.finished == "succeeded"
    run = store.get_run(rid, with_graph=True)
    assert run["status"] == "succeeded" and run["final_metrics"] == {"loss": 0.5}
    assert run["execution_facts"] == {"visible_devices": ["cpu"]}
    assert run["warnings"] == [warning, {"kind": "k", "message": "m"}]
    assert run["graph"] == {"1": {"class_type": "X", "inputs": {}}}
    assert run["started_at"] is not None and run["finished_at"] == 3.0 and run["pid"] == 123
    assert cursors(store, rid) == list(range(1, 9))
    assert [e["type"] for e in store.events_after(rid)] == [
        "status", "run_warning", "status", "status", "run_started", "metric", "run_warning", "run_finished"]


def test_replayed_events_are_stored_once_and_a_run_ends_once(store):
    rid = make_run(store)
    batch = [NewEvent("progress", {"value": i}, float(i), i) for i in range(1, 6)]
    assert store.append_events(rid, batch[:3]).stored == 3
    assert store.append_events(rid, batch).stored == 2  # a reconnecting worker resends 1..5
    assert store.last_source_seq(rid) == 5
    assert store.finish(rid, "cancelled", error="cancelled while queued")
    assert not store.finish(rid, "failed", error="late")
    late = store.append_events(rid, [NewEvent("run_finished", {"status": "succeeded"}, 9.0, 6)])
    assert late.finished is None
    run = store.get_run(rid)
    assert (run["status"], run["error"]) == ("cancelled", "cancelled while queued")
    assert cursors(store, rid) == list(range(1, run["cursor"] + 1))
    assert [e["type"] for e in store.events_after(rid)].count("run_finished") == 1


def test_events_after_pages_by_cursor_and_filters_by_type(store):
    rid = make_run(store)
    store.append_events(rid, [NewEvent("metric" if i % 2 else "progress", {"i": i}, None, i) for i in range(1, 21)])
    seen, cursor = [], 0
    for _ in range(100):
        page = store.events_after(rid, cursor, 4)
        if not page:
            break
        seen += [e["cursor"] for e in page]
        cursor = page[-1]["cursor"]
    assert seen == list(range(1, 22))
    metrics = store.events_after(rid, 0, 100, ["metric"])
    assert len(metrics) == 10 and all(e["type"] == "metric" for e in metrics)


def test_a_failing_write_leaves_nothing_half_written(store):
    rid = make_run(store)
    before = cursors(store, rid)
    bad = [NewEvent("progress", {"value": 1}, 1.0, 1)]
    store.append_events(rid, bad[:1])
    with pytest.raises(sqlite3.IntegrityError):
        with store.transaction() as db:
            store.append_events(rid, [NewEvent("log", {"message": "kept?"}, 3.0, None)])
            db.execute("INSERT INTO events(run_id, cursor, type, payload, ts) VALUES (?, 1, 'x', '{}', 0)", (rid,))
    assert cursors(store, rid) == before + [before[-1] + 1]  # only the first, committed, event
    assert all(e["type"] != "log" for e in store.events_after(rid))
    with pytest.raises(ValueError):
        make_run(store, graph={"1": {"class_type": "X", "inputs": {"x": float("nan")}}})
    assert store.list_runs()[1] == 1  # the failed insert left no run behind
    with pytest.raises(StoreError) as exc:
        store.append_events("nope", [NewEvent("log", {}, 1.0, None)])
    assert exc.value.status == 404


def test_nan_in_event_payloads_is_stored_as_null(store):
    rid = make_run(store)
    store.append_events(rid, [NewEvent("metric", {"name": "loss", "value": float("nan")}, 1.0, 1)])
    assert store.events_after(rid, 1)[0]["payload"] == {"name": "loss", "value": None}


def test_list_filters_and_paging(store):
    ids = [make_run(store, name=f"sweep-{i}" if i % 2 else f"train_{i}", target="local" if i < 4 else "gpu-box")
           for i in range(6)]
    runs, total = store.list_runs(limit=2)
    assert total == 6 and [r["id"] for r in runs] == ids[::-1][:2]  # newest first
    runs, total = store.list_runs(limit=2, offset=4)
    assert [r["id"] for r in runs] == ids[1::-1]
    assert store.list_runs(name="sweep")[1] == 3
    assert store.list_runs(name="train_")[1] == 3  # '_' is literal, not a wildcard
    assert store.list_runs(name="%")[1] == 0
    assert store.list_runs(worker="gpu-box")[1] == 2 and store.list_runs(worker="local")[1] == 4
    store.finish(ids[0], "failed", error="x")
    assert [r["id"] for r in store.list_runs(statuses=["failed"])[0]] == [ids[0]]
    assert store.list_runs(statuses=["queued", "failed"])[1] == 6
    assert store.counts()["queued"] == 5 and store.counts()["failed"] == 1
    assert "graph" not in runs[0]


def test_delete_only_finished_runs(store):
    rid = make_run(store)
    with pytest.raises(StoreError) as exc:
        store.delete_run(rid)
    assert exc.value.status == 409 and "only a finished run can be deleted" in str(exc.value)
    store.finish(rid, "cancelled")
    assert store.delete_run(rid)["id"] == rid
    assert store.get_run(rid) is None and store.events_after(rid) == []
    with pytest.raises(StoreError) as exc:
        store.delete_run(rid)
    assert exc.value.status == 404


def test_other_modules_add_their_tables_and_state_survives_reopening(tmp_path):
    s = Store(tmp_path / "db.sqlite")
    s.ensure_schema("workers", "CREATE TABLE IF NOT EXISTS workers (name TEXT PRIMARY KEY, mode TEXT);", 2)
    with s.transaction() as db:
        db.execute("INSERT INTO workers VALUES ('box', 'shared')")
    rid = make_run(s)
    s.close()
    s = Store(tmp_path / "db.sqlite")
    assert s.schema_version("workers") == 2 and s.schema_version("core") == 1
    assert [tuple(r) for r in s.query("SELECT * FROM workers")] == [("box", "shared")]
    assert s.get_run(rid)["status"] == "queued"
    s.close()
    with contextlib.closing(sqlite3.connect(tmp_path / "db.sqlite")) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"  # readers of the file never block its writer


def test_end_queued_ends_only_the_queued_ones_in_one_transaction_as_a_cancel_does(store):
    queued = [make_run(store, name=f"q{i}") for i in range(3)]
    started = make_run(store, name="started")
    assert store.assign(started, provider="local", placement="local", devices=["cpu"], run_dir="/tmp/x")
    done = make_run(store, name="done")
    assert store.finish(done, "failed", error="x")
    ended = store.end_queued([*queued, started, done, "no-such-run"], "cancelled", "cancelled: sweep s cancelled")
    assert ended == queued
    for rid in queued:
        run = store.get_run(rid)
        assert (run["status"], run["error"], run["cancel_requested"]) == ("cancelled", "cancelled: sweep s cancelled",
                                                                          True)
        last = store.events_after(rid)[-1]
        assert last["type"] == "run_finished" and last["payload"]["status"] == "cancelled"
    assert store.get_run(started)["status"] == "assigned" and store.get_run(done)["status"] == "failed"
    with pytest.raises(ValueError, match="not a terminal status"):
        store.end_queued(queued, "running", "x")
