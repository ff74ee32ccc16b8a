"""Sweeps against a real Dispatcher and Store in this process: the whole-batch check through the one
per-run admission function, one transaction, the table, cancel, delete."""

from __future__ import annotations

import asyncio
import copy
import json
from pathlib import Path

import pytest
from sweep_helpers import Box  # registered by conftest.py

from xpufleet.common.errors import ApiError, RequestError, StoreError
from xpufleet.server.run.requests import parse_run_request
from xpufleet.server.sidecar.dispatcher import Dispatcher
from xpufleet.server.sweeps.driver import SweepService
from xpufleet.server.sweeps.records import SCHEMA

GRAPH = json.loads((Path(__file__).resolve().parents[3] / "samples" / "mlp_digits.json").read_text())
OBJ = {"metric": "val_accuracy"}


def body(**kw):
    return {"name": "lr", "graph": copy.deepcopy(GRAPH), "objective": OBJ, "parameters": {"5.lr": [0.001, 0.01]},
            **kw}


def service(dispatcher: Dispatcher, *providers: Box) -> SweepService:
    for p in providers or (Box("local", ["cpu"], is_local=True),):
        dispatcher.register_provider(p)
    return SweepService(dispatcher.store, dispatcher)


def nothing_written(dispatcher: Dispatcher) -> None:
    assert dispatcher.store.list_runs()[1] == 0 and dispatcher.queue_length() == 0
    assert dispatcher.store.query("SELECT COUNT(*) AS n FROM sweeps")[0]["n"] == 0
    assert dispatcher.store.query("SELECT COUNT(*) AS n FROM sweep_variants")[0]["n"] == 0
    assert dispatcher.store.query("SELECT COUNT(*) AS n FROM run_memory")[0]["n"] == 0  # the budgets' records


def test_the_schema_is_registered_through_the_store(dispatcher):
    service(dispatcher)
    assert dispatcher.store.schema_version(SCHEMA.name) == SCHEMA.version


def test_a_sweep_queues_every_child_as_post_api_runs_would(dispatcher):
    svc = service(dispatcher, Box("box-a", ["cpu", "cuda:0"]), Box("box-b", ["cpu", "cuda:0"]),
                  Box("local", ["cpu"], is_local=True))
    answer = svc.create(body(seeds=2, options={"device": "cuda", "target": {"worker": "any"}}))
    assert answer["n_runs"] == 4 and answer["status"] == "queued" and dispatcher.queue_length() == 4
    runs = [dispatcher.store.get_run(rid, with_graph=True) for rid in answer["run_ids"]]
    alone = dispatcher.store.get_run(dispatcher.submit(parse_run_request(
        {"graph": runs[0]["graph"], "options": runs[0]["options"]}))["run_id"], with_graph=True)
    for run in runs:  # the same target, candidates and queue key as one run submitted alone
        assert (run["target"], run["queue_key"], run["candidates"]) == (alone["target"], alone["queue_key"],
                                                                        alone["candidates"])
        assert run["queue_key"] == "any/cuda" and [c["provider"] for c in run["candidates"]] == ["box-a", "box-b"]
    assert [r["seed"] for r in runs] == [0, 1, 0, 1]
    memory = dispatcher.memory.records.runs(answer["run_ids"])  # the memory records, in the same transaction
    assert sorted(memory) == sorted(answer["run_ids"]) and len({m.graph_key for m in memory.values()}) == 1
    assert [r["graph"]["5"]["inputs"]["lr"] for r in runs] == [0.001, 0.001, 0.01, 0.01]
    got = svc.get(answer["sweep_id"])
    assert got["status"] == "queued" and got["counts"] == {"queued": 4} and got["parameters"] == ["5.lr"]
    assert [r["variant"] for r in got["table"]] == [0, 1, 2, 3] and all(r["rank"] is None for r in got["table"])
    assert all(r["queue_key"] == "any/cuda" and r["status"] == "queued" for r in got["table"])
    assert got["points"] is not None and len(got["points"]) == 2


def test_one_child_the_server_rejects_rejects_the_whole_sweep_and_writes_nothing(dispatcher):
    svc = service(dispatcher)
    with pytest.raises(RequestError) as exc:
        svc.create(body(parameters={"5.lr": [0.001, 0.01, -1.0, 0.1]}))
    assert exc.value.status == 400
    assert exc.value.message.startswith("variant 2 (5.lr=-1): graph: Prompt outputs failed validation")
    assert exc.value.message.endswith("; nothing was queued")
    assert exc.value.extra["variant"] == 2 and exc.value.extra["parameters"] == {"5.lr": -1.0}
    assert "5" in exc.value.extra["node_errors"]  # the run's own details come along
    nothing_written(dispatcher)


@pytest.mark.parametrize("options, needle", [
    ({"target": "nobody"}, "unknown worker 'nobody': no worker with this name has connected since the server "
                           "started; nothing was queued"),
    ({"target": {"worker": "local", "devices": ["cuda:0"]}}, "this server does not offer cuda:0 (it offers cpu)"),
    ({"target": {"worker": "any", "devices": ["cuda:0", "cuda:3"]}}, "runs on workers only"),
    ({"target": {"worker": "local", "memory_gib": 4}}, "options.target.memory_gib on a run this server may run"),
    ({"record_outputs": "yes"}, "options.record_outputs: must be true (kept on the worker), \"upload\""),
    ({"target": {"pool": "p"}}, "unknown pool 'p': no one-shot worker pool with this name is known"),
    ({"colour": "red"}, "options: unknown field(s) colour"),
])
def test_a_target_one_run_would_reject_rejects_the_sweep(dispatcher, options, needle):
    svc = service(dispatcher)
    with pytest.raises(RequestError) as exc:
        svc.create(body(options=options))
    assert exc.value.status == 400 and needle in exc.value.message, exc.value.message
    nothing_written(dispatcher)
    with pytest.raises(RequestError) as single:  # the same text as POST /api/runs gives one run
        dispatcher.submit(parse_run_request({"graph": GRAPH, "options": options}))
    assert single.value.message.split(";")[0] in exc.value.message


def test_the_memory_rules_of_one_run_reject_the_whole_sweep_through_the_same_admission(dispatcher):
    """A budget goes only to agents that can cap it (docs/memory.md): Box announces no such capability."""
    svc = service(dispatcher, Box("box", ["cpu", "cuda:0"]))
    with pytest.raises(RequestError) as exc:
        svc.create(body(options={"device": "cuda", "target": {"worker": "box", "memory_gib": 4}}))
    assert exc.value.message.startswith("variant 0 (5.lr=0.001): worker box runs an agent that cannot cap a run's "
                                        "memory to its budget") and exc.value.message.endswith("nothing was queued")
    nothing_written(dispatcher)
    with pytest.raises(RequestError) as single:
        dispatcher.submit(parse_run_request({"graph": GRAPH, "options": {"device": "cuda", "target": {
            "worker": "box", "memory_gib": 4}}}))
    assert single.value.message in exc.value.message


def test_the_whole_batch_check_is_the_dispatchers_own_admission_once_per_child_before_any_write(dispatcher, monkeypatch):
    svc = service(dispatcher)
    seen: list[tuple[str | None, int]] = []
    real = Dispatcher.admit

    def spy(self, request, infos=None, facts=None):
        seen.append((request.name, self.store.list_runs()[1]))
        return real(self, request, infos, facts)

    monkeypatch.setattr(Dispatcher, "admit", spy)
    enqueued: list[int] = []
    real_enqueue = Dispatcher.enqueue

    def enqueue_spy(self, admissions, write_extra=None):
        enqueued.append(len(admissions))
        return real_enqueue(self, admissions, write_extra)

    monkeypatch.setattr(Dispatcher, "enqueue", enqueue_spy)
    svc.create(body(parameters={"5.lr": [0.001, 0.002, 0.004]}))
    assert [n for _, n in seen] == [0, 0, 0]  # every child checked while nothing was written
    assert [name for name, _ in seen] == ["lr #0 5.lr=0.001", "lr #1 5.lr=0.002", "lr #2 5.lr=0.004"]
    assert enqueued == [3]  # then one batch
    seen.clear()
    dispatcher.submit(parse_run_request({"graph": GRAPH}))  # POST /api/runs goes through the same check
    assert len(seen) == 1 and enqueued == [3, 1]


def test_enqueue_is_one_transaction_a_failure_inside_leaves_nothing(dispatcher):
    service(dispatcher)
    admissions = [dispatcher.admit(parse_run_request({"graph": GRAPH})) for _ in range(3)]

    def fail(run_ids):
        assert len(run_ids) == 3 and dispatcher.store.list_runs()[1] == 3  # inside the transaction
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        dispatcher.enqueue(admissions, write_extra=fail)
    assert dispatcher.store.list_runs()[1] == 0 and dispatcher.queue_length() == 0
    assert len(dispatcher.enqueue(admissions)) == 3 and dispatcher.queue_length() == 3


def test_a_dry_run_expands_and_checks_but_writes_nothing(dispatcher):
    svc = service(dispatcher)
    plan = svc.create(body(seeds=2), dry_run=True)
    assert plan["n_runs"] == 4 and [v["seed"] for v in plan["variants"]] == [0, 1, 0, 1]
    assert all(v["queue_key"] == "local/auto" for v in plan["variants"])
    nothing_written(dispatcher)
    with pytest.raises(RequestError):
        svc.create(body(parameters={"5.lr": [-1.0]}), dry_run=True)


def test_the_table_ranks_finished_children_and_reports_where_they_ran(dispatcher):
    svc = service(dispatcher, Box("box", ["cpu", "cuda:0", "cuda:1"]))
    sweep = svc.create(body(parameters={"5.lr": [0.001, 0.01, 0.1]}, options={"target": "box", "device": "cuda"}))
    ids = sweep["run_ids"]
    store = dispatcher.store
    for rid, dev in zip(ids, ["cuda:0", "cuda:1"], strict=False):
        assert store.assign(rid, provider="box", placement="worker", devices=[dev], run_dir=None)
        store.mark_running(rid, pid=1)
    store.finish(ids[0], "succeeded", final_metrics={"val_accuracy": 0.8})
    store.finish(ids[1], "succeeded", final_metrics={"val_accuracy": 0.9})
    got = svc.get(sweep["sweep_id"])
    assert got["status"] == "running" and got["counts"] == {"succeeded": 2, "queued": 1}
    top, second, third = got["table"]
    assert (top["rank"], top["variant"], top["metric"], top["worker_id"], top["devices"], top["queue_key"]) == \
        (1, 1, 0.9, "box", ["cuda:1"], "box/cuda")
    assert (second["rank"], second["variant"], second["devices"]) == (2, 0, ["cuda:0"])
    assert (third["rank"], third["status"], third["worker_id"]) == (None, "queued", None)
    assert got["best"]["variant"] == 1 and got["points"] is None
    csv_text = svc.csv(sweep["sweep_id"])
    assert csv_text.splitlines()[1].startswith(f"1,1,1,{ids[1]},lr #1 5.lr=0.01,succeeded,0.9,0.01,,box,cuda:1,box/cuda,")
    listing = svc.list(50, 0)
    assert listing["total"] == 1 and listing["sweeps"][0]["counts"] == {"succeeded": 2, "queued": 1}
    assert listing["sweeps"][0]["status"] == "running"


async def test_cancel_ends_queued_children_and_stops_running_ones_then_delete(dispatcher):
    box = Box("box", ["cpu", "cuda:0"])
    svc = service(dispatcher, box)
    sweep = svc.create(body(parameters={"5.lr": [0.001, 0.01, 0.1]}, options={"target": "box", "device": "cuda"}))
    ids = sweep["run_ids"]

    dispatcher._wake = asyncio.Event()
    dispatcher.schedule()  # the first child takes the card; the others wait
    for _ in range(3000):  # the start task runs (it reads the graph in a worker thread first)
        if box.started:
            break
        await asyncio.sleep(0.01)
    assert box.started == [ids[0]]
    dispatcher.run_process_started(ids[0], pid=1)
    with pytest.raises(ApiError) as busy:
        svc.delete(sweep["sweep_id"])
    assert busy.value.status == 409
    got = await svc.cancel(sweep["sweep_id"], "enough")
    assert box.cancelled == [ids[0]]  # the running one is asked to stop
    assert [dispatcher.store.get_run(i)["status"] for i in ids] == ["running", "cancelled", "cancelled"]
    assert got["status"] == "cancelling" and got["cancel_requested"]
    assert dispatcher.store.get_run(ids[1])["error"] == "cancelled: sweep lr cancelled: enough"
    dispatcher.run_ended(ids[0], "cancelled", "cancelled by request")  # what the worker reports
    got = svc.get(sweep["sweep_id"])
    assert got["status"] == "cancelled" and got["counts"] == {"cancelled": 3}
    with pytest.raises(StoreError):
        await dispatcher.cancel(ids[1])  # nothing left to cancel
    await svc.cancel(sweep["sweep_id"])  # a second cancel is harmless
    gone = svc.delete(sweep["sweep_id"])
    assert gone == {"deleted": sweep["sweep_id"], "runs_deleted": 3}
    assert dispatcher.store.list_runs()[1] == 0
    with pytest.raises(ApiError) as missing:
        svc.get(sweep["sweep_id"])
    assert missing.value.status == 404


async def test_wait_change_returns_at_a_childs_news_or_the_timeout(dispatcher):
    svc = service(dispatcher)
    sweep = svc.create(body())
    version = svc.get(sweep["sweep_id"])["version"]

    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await svc.wait_change(sweep["sweep_id"], version, 0.2)  # nothing happens: the timeout
    assert loop.time() - t0 >= 0.19
    waiting = asyncio.ensure_future(svc.wait_change(sweep["sweep_id"], version, 30))
    await asyncio.sleep(0)
    assert not waiting.done()
    await dispatcher.cancel(sweep["run_ids"][0])  # news: the hub wakes the long-poll
    await asyncio.wait_for(waiting, 5)
    assert svc.get(sweep["sweep_id"])["version"] != version
    await svc.wait_change(sweep["sweep_id"], version, 30)  # an old version returns at once


async def test_a_deleted_child_shows_as_deleted(dispatcher):
    svc = service(dispatcher)
    sweep = svc.create(body())
    await dispatcher.cancel(sweep["run_ids"][0])
    dispatcher.delete(sweep["run_ids"][0])
    got = svc.get(sweep["sweep_id"])
    assert [r["status"] for r in got["table"]] == ["queued", "deleted"] or \
        [r["status"] for r in got["table"]] == ["deleted", "queued"]
    assert got["counts"] == {"deleted": 1, "queued": 1}


def test_the_draft_off_the_loop_leaves_the_admission_only_decisions(dispatcher, monkeypatch):
    """The sweep route parses, validates and keys every child in a worker thread (draft, issue 19); the
    admission on the event loop then neither validates nor computes a key, and a child found invalid is
    refused with the same words as a check on the spot."""
    import xpufleet.server.memory.submit as gk
    import xpufleet.server.run.validation as validation

    svc = service(dispatcher)
    bad = body(parameters={"5.lr": [0.001, -1.0]})
    drafted = svc.draft(bad)
    assert [f.problem is None for f in drafted.facts] == [True, False]  # a negative learning rate fails
    calls: list[str] = []
    real, real_key = validation.validate_report, gk.graph_key
    monkeypatch.setattr(validation, "validate_report", lambda graph, *a, **k: calls.append("v") or real(graph, *a, **k))
    monkeypatch.setattr(gk, "graph_key", lambda graph, *a, **k: calls.append("k") or real_key(graph, *a, **k))
    good = body(parameters={"5.lr": [0.001, 0.002]})
    drafted_good = svc.draft(good)
    assert calls == ["v", "k", "v", "k"]  # in the draft (the worker thread)
    calls.clear()
    svc.create(good, draft=drafted_good)
    assert calls == []  # admit() trusted them
    with pytest.raises(RequestError) as exc:
        svc.create(bad, draft=drafted)
    assert calls == []
    with pytest.raises(RequestError) as unchecked:
        svc.create(bad)
    assert exc.value.message == unchecked.value.message and "variant 1" in exc.value.message
    assert svc.draft({"graph": "nope"}).error is not None
