"""Studies in this process: the real Dispatcher, Store, EventHub and Optuna (its RDBStorage on the same
state.db), runs played by ScriptedBox (sweep_helpers.py) the way run processes report them."""

from __future__ import annotations

import asyncio
import copy
import json
import sqlite3
from pathlib import Path
from typing import Any

import optuna
import pytest
from sweep_helpers import Box, ScriptedBox, lr_of  # registered by conftest.py

from xpufleet.common.errors import ApiError, RequestError
from xpufleet.server.sidecar.dispatcher import Dispatcher
from xpufleet.server.sidecar.store import Store
from xpufleet.server.sweeps.optuna_bridge import reported_value
from xpufleet.server.sweeps.spec import parse_study
from xpufleet.server.sweeps.study import StudyService

pytestmark = pytest.mark.timeout(180)

GRAPH = json.loads((Path(__file__).resolve().parents[3] / "samples" / "mlp_digits.json").read_text())


def study_body(**kw: Any) -> dict[str, Any]:
    return {"name": "lr", "graph": copy.deepcopy(GRAPH), "objective": {"metric": "val_accuracy"},
            "parameters": {"5.lr": {"low": 1e-4, "high": 1.0, "log": True}}, "n_trials": 10, "parallel": 2,
            "pruner": {"type": "median", "metric": "val_loss_step", "n_startup_trials": 2},
            "sampler": {"type": "random", "seed": 3}, "options": {"device": "cuda", "target": {"worker": "any"}},
            **kw}


async def fleet(home: Path, tick: float = 0.02, script: Any = None):
    store = Store(home / "state.db")
    d = Dispatcher(store, home)
    boxes = [ScriptedBox(n, d, tick=tick, devices=["cpu", "cuda:0"], **({"script": script} if script else {}))
             for n in ("box-a", "box-b")]
    for b in boxes:
        d.register_provider(b)
    await d.start()
    svc = StudyService(store, d, home / "state.db")
    await svc.start()
    return store, d, boxes, svc


async def teardown(store: Store, d: Dispatcher, boxes: list[ScriptedBox], svc: StudyService) -> None:
    await svc.close()
    for b in boxes:
        for t in b.tasks:
            t.cancel()
    await d.shutdown()  # the store stays open for the test's checks (closed with the test's tmp_path)


def optuna_trials(home: Path, name: str) -> list[Any]:
    return optuna.load_study(study_name=name, storage=f"sqlite:///{home / 'state.db'}").get_trials(deepcopy=False)


def test_reported_values_follow_the_studys_direction():
    spec = parse_study(study_body())
    assert reported_value(spec, 0.4) == -0.4  # maximise val_accuracy, prune on a loss: negated
    same = parse_study(study_body(pruner={"type": "median", "metric": "val_accuracy"}))
    assert reported_value(same, 0.4) == 0.4


def test_a_study_asks_prunes_completes_and_fails_trials_and_knows_the_best(tmp_path):
    async def scenario():
        store, d, boxes, svc = await fleet(tmp_path)
        try:
            created = await svc.create(study_body())
            assert created["n_trials"] == 10 and created["parallel"] == 2
            await asyncio.wait_for(svc.wait_idle(created["study_id"]), 150)
            return svc.get(created["study_id"]), store, boxes
        finally:
            await teardown(store, d, boxes, svc)

    got, store, boxes = asyncio.run(scenario())
    trials = got["trials"]
    assert got["status"] == "finished" and got["error"] is None and len(trials) == 10
    assert sum(got["counts"].values()) == 10 and got["counts"].get("pruned", 0) >= 1, got["counts"]
    assert got["counts"].get("complete", 0) >= 2
    states = {t["number"]: t["state"] for t in trials}
    # Optuna's own record agrees, trial by trial, and on the best
    record = {t.number: t for t in optuna_trials(tmp_path, f"xpufleet-{got['id']}")}
    to_ours = {"COMPLETE": "complete", "PRUNED": "pruned", "FAIL": "failed"}
    assert {n: to_ours[t.state.name] for n, t in record.items()} == states
    best = got["best_trial"]
    complete = [t for t in trials if t["state"] == "complete"]
    assert best["value"] == max(t["value"] for t in complete)
    optuna_best = max((t for t in record.values() if t.state.name == "COMPLETE"), key=lambda t: t.value)
    assert (best["number"], best["value"]) == (optuna_best.number, optuna_best.value)
    assert best["parameters"]["5.lr"] == optuna_best.params["5.lr"]
    by_id = {rid: status for b in boxes for rid, status in b.finished.items()}
    cancelled = {rid for b in boxes for rid in b.cancelled}
    for t in trials:
        assert t["worker_id"] in ("box-a", "box-b") and t["queue_key"] == "any/cuda" and t["devices"] == ["cuda:0"]
        record_t = record[t["number"]]
        if t["state"] == "pruned":  # told at once, and its run stopped (cancelled) rather than trained on
            assert t["run_id"] in cancelled and t["pruned_step"] == max(record_t.intermediate_values)
            assert t["run_status"] == "cancelled" and by_id[t["run_id"]] == "cancelled"
            reasons = [e["payload"]["reason"] for e in store.events_after(t["run_id"], types=["cancel_requested"])]
            assert reasons == [f"pruned by study lr at step {t['pruned_step']} (val_loss_step "
                               f"{record_t.intermediate_values[t['pruned_step']] * -1:g})"]
        elif t["state"] == "complete":
            assert t["run_status"] == "succeeded" and t["value"] == record_t.value
            assert len(record_t.intermediate_values) == 20  # every val_loss_step it reported
            assert t["value"] == store.get_run(t["run_id"])["final_metrics"]["val_accuracy"]
        else:
            assert t["run_status"] == "failed" and t["reason"] == "the run ended failed: the loss diverged"
            assert lr_of(store.get_run(t["run_id"], with_graph=True)["graph"]) > 0.5
    # two trials in flight at a time, never more (one card on each of two boxes)
    spans = sorted((store.get_run(t["run_id"])["started_at"], store.get_run(t["run_id"])["finished_at"])
                   for t in trials)
    assert max(sum(1 for s, e in spans if s <= start < e) for start, _ in spans) <= 2


def test_a_probe_point_one_run_would_reject_rejects_the_study_before_anything_is_queued(tmp_path):
    async def scenario():
        store = Store(tmp_path / "state.db")
        d = Dispatcher(store, tmp_path)
        d.register_provider(Box("local", ["cpu"], is_local=True))
        svc = StudyService(store, d, tmp_path / "state.db")
        try:
            with pytest.raises(RequestError) as exc:
                await svc.create(study_body(options={}, parameters={"5.name": ["adam", "nope"]}))
            assert exc.value.message.startswith("the study's runs (5.name=nope): graph: Prompt outputs failed")
            with pytest.raises(RequestError) as exc:
                await svc.create(study_body(options={"target": "nobody"}))
            assert "unknown worker 'nobody'" in exc.value.message
            assert store.list_runs()[1] == 0 and svc.list(50, 0)["total"] == 0
        finally:
            await svc.close()
            store.close()

    asyncio.run(scenario())
    db = sqlite3.connect(tmp_path / "state.db")
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert "studies" not in tables or db.execute("SELECT COUNT(*) FROM studies").fetchone()[0] == 0


def test_cancel_stops_every_trial_and_asks_no_more(tmp_path):
    def slow(graph):
        return [(10 * k, 1.0) for k in range(1, 2000)], {"val_accuracy": 0.5}, "succeeded"

    async def scenario():
        store, d, boxes, svc = await fleet(tmp_path, tick=0.05, script=slow)
        try:
            created = await svc.create(study_body(pruner="none"))
            sid = created["study_id"]
            for _ in range(400):  # until both trials run (bounded; each wait is for the study's next change)
                got = svc.get(sid)
                if sum(1 for t in got["trials"] if t["run_status"] == "running") == 2:
                    break
                await svc.wait_change(sid, got["version"], 5)
            got = await svc.cancel(sid, "enough")
            assert got["status"] == "cancelling"
            await asyncio.wait_for(svc.wait_idle(sid), 60)
            got = svc.get(sid)
            with pytest.raises(ApiError) as again:
                await svc.cancel(sid)
            assert again.value.status == 409
            return got
        finally:
            await teardown(store, d, boxes, svc)

    got = asyncio.run(scenario())
    assert got["status"] == "cancelled" and len(got["trials"]) == 2  # no trial asked after the cancel
    assert all(t["state"] == "failed" and t["run_status"] == "cancelled" for t in got["trials"])
    assert all("study lr cancelled: enough" in t["reason"] for t in got["trials"])
    states = {t.state.name for t in optuna_trials(tmp_path, f"xpufleet-{got['id']}")}
    assert states == {"FAIL"}


def test_a_study_resumes_after_its_service_restarts(tmp_path):
    async def scenario():
        store, d, boxes, svc = await fleet(tmp_path, tick=0.03)
        try:
            created = await svc.create(study_body(n_trials=6, pruner="none"))
            sid = created["study_id"]
            for _ in range(400):
                got = svc.get(sid)
                if len(got["trials"]) >= 3:
                    break
                await svc.wait_change(sid, got["version"], 5)
            await svc.close()  # the sidecar stops: the study stays running in the database
            assert svc.records.get(sid)["status"] == "running"
            again = StudyService(store, d, tmp_path / "state.db")
            await again.start()
            await asyncio.wait_for(again.wait_idle(sid), 120)
            return again.get(sid), again
        finally:
            for b in boxes:
                for t in b.tasks:
                    t.cancel()
            await d.shutdown()

    got, again = asyncio.run(scenario())
    assert got["status"] == "finished" and len(got["trials"]) == 6
    assert all(t["state"] == "complete" for t in got["trials"]), [(t["state"], t["reason"]) for t in got["trials"]]
    record = optuna_trials(tmp_path, f"xpufleet-{got['id']}")
    assert sorted(t.number for t in record) == list(range(6)) and {t.state.name for t in record} == {"COMPLETE"}


def test_delete_removes_an_ended_study_with_its_runs_and_its_optuna_study(tmp_path):
    async def scenario():
        store, d, boxes, svc = await fleet(tmp_path, tick=0.005)
        try:
            created = await svc.create(study_body(n_trials=2, pruner="none"))
            sid = created["study_id"]
            with pytest.raises(ApiError) as busy:
                await svc.delete(sid)
            assert busy.value.status == 409
            await asyncio.wait_for(svc.wait_idle(sid), 60)
            assert await svc.delete(sid) == {"deleted": sid, "runs_deleted": 2}
            assert store.list_runs()[1] == 0 and svc.list(50, 0)["total"] == 0
            return sid
        finally:
            await teardown(store, d, boxes, svc)

    sid = asyncio.run(scenario())
    names = [s.study_name for s in optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'state.db'}")]
    assert f"xpufleet-{sid}" not in names
