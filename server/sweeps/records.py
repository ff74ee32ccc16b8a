"""What the sidecar keeps of sweeps and studies in its SQLite (``state.db``), through ``Store.ensure_schema``.

Tables: ``sweeps`` and ``sweep_variants`` (one row per child run: its point, values and seed);
``xpufleet_studies`` and ``xpufleet_study_trials`` (one row per trial: Optuna's trial number and id, the
run, the state, the value). The study tables carry a prefix because Optuna's own tables live in the same
file (``studies``, ``trials``, ``trial_*``, ``study_*``: see study.py).

A child's status, worker, devices and metrics are the run's own: they are read from the store's
``runs`` table (its public columns) in the same query, never copied here.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ...common.schema import Schema
from .expand import Variant
from .ranking import Row, metric_of

SCHEMA = Schema("sweeps", 1, """
CREATE TABLE IF NOT EXISTS sweeps (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    graph TEXT NOT NULL,
    metric TEXT NOT NULL,
    direction TEXT NOT NULL,
    paths TEXT NOT NULL,
    n_runs INTEGER NOT NULL,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    cancelled_at REAL
);
CREATE TABLE IF NOT EXISTS sweep_variants (
    sweep_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    point INTEGER NOT NULL,
    run_id TEXT NOT NULL,
    params TEXT NOT NULL,
    seed INTEGER,
    PRIMARY KEY (sweep_id, idx)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS sweep_variants_run ON sweep_variants(run_id);
CREATE TABLE IF NOT EXISTS xpufleet_studies (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    spec TEXT NOT NULL,
    graph TEXT NOT NULL,
    optuna_name TEXT NOT NULL UNIQUE,
    metric TEXT NOT NULL,
    direction TEXT NOT NULL,
    paths TEXT NOT NULL,
    n_trials INTEGER NOT NULL,
    status TEXT NOT NULL,
    error TEXT,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    changes INTEGER NOT NULL DEFAULT 0,
    created_at REAL NOT NULL,
    finished_at REAL
);
CREATE TABLE IF NOT EXISTS xpufleet_study_trials (
    study_id TEXT NOT NULL,
    number INTEGER NOT NULL,
    trial_id INTEGER NOT NULL,
    run_id TEXT,
    params TEXT NOT NULL,
    state TEXT NOT NULL,
    value REAL,
    pruned_step INTEGER,
    reason TEXT,
    created_at REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (study_id, number)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS xpufleet_study_trials_run ON xpufleet_study_trials(run_id);
""")

TRIAL_STATES = ("running", "complete", "pruned", "failed")
STUDY_ACTIVE = ("running", "cancelling")

# The run's fields a table row shows (the store's public run columns).
_RUN_COLUMNS = ("r.id AS r_id, r.name AS r_name, r.status AS r_status, r.worker_id AS r_worker, "
                "r.devices AS r_devices, r.queue_key AS r_queue_key, r.final_metrics AS r_final, "
                "r.error AS r_error, r.created_at AS r_created, r.started_at AS r_started, "
                "r.finished_at AS r_finished")
# Moves of a child through queued -> assigned -> running -> ended (and deleted, worth more than all three):
# the long-poll's version. It grows with every change a table shows, and not with progress events.
_MOVES = ("((r.assigned_at IS NOT NULL) + (r.started_at IS NOT NULL) + (r.finished_at IS NOT NULL)"
          " + 4 * (r.id IS NULL))")


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _row(index: int, point: int, values: dict[str, Any], seed: int | None, run_id: str | None,
         r: sqlite3.Row, metric: str) -> Row:
    if run_id is None:
        return Row(index, point, values, seed, None, "not queued")
    if r["r_id"] is None:
        return Row(index, point, values, seed, run_id, "deleted")
    return Row(index, point, values, seed, run_id, r["r_status"], metric_of(
        json.loads(r["r_final"]) if r["r_final"] else None, metric), r["r_name"], r["r_worker"],
        json.loads(r["r_devices"]), r["r_queue_key"], r["r_created"], r["r_started"], r["r_finished"],
        r["r_error"])


PROGRESS_KEYS = ("value", "max", "text", "epoch", "batch", "batches", "loss")


def last_progress(store: Any, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """run id -> its latest ``progress`` event's payload (value of max, epoch, loss; docs/events.md), for
    the runs among ``run_ids`` that reported one. One indexed look-up per run (events_type index)."""
    out: dict[str, dict[str, Any]] = {}
    for run_id in run_ids:
        q = store.query("SELECT payload FROM events WHERE run_id=? AND type='progress' ORDER BY cursor DESC LIMIT 1",
                        (run_id,))
        if q:
            payload = json.loads(q[0]["payload"])
            out[run_id] = {k: payload[k] for k in PROGRESS_KEYS if payload.get(k) is not None}
    return out


class SweepRecords:
    """Reads and writes of the sweep tables (on the store's one connection)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        SCHEMA.ensure(store)

    def insert(self, sweep_id: str, name: str, spec: Mapping[str, Any], graph: Mapping[str, Any], metric: str,
               direction: str, paths: Sequence[str], variants: Sequence[Variant], run_ids: Sequence[str]) -> None:
        """The sweep and its variants (called inside the transaction that creates the child runs)."""
        with self.store.transaction() as db:
            db.execute("INSERT INTO sweeps(id, name, spec, graph, metric, direction, paths, n_runs, created_at)"
                       " VALUES (?,?,?,?,?,?,?,?,?)",
                       (sweep_id, name, _dumps(spec), _dumps(graph), metric, direction, _dumps(list(paths)),
                        len(variants), time.time()))
            db.executemany("INSERT INTO sweep_variants(sweep_id, idx, point, run_id, params, seed) VALUES (?,?,?,?,?,?)",
                           [(sweep_id, v.index, v.point, rid, _dumps(v.values), v.seed)
                            for v, rid in zip(variants, run_ids, strict=True)])

    def get(self, sweep_id: str) -> dict[str, Any] | None:
        rows = self.store.query("SELECT * FROM sweeps WHERE id=?", (sweep_id,))
        return self._sweep(rows[0]) if rows else None

    @staticmethod
    def _sweep(r: sqlite3.Row) -> dict[str, Any]:
        return {"id": r["id"], "name": r["name"], "spec": json.loads(r["spec"]), "metric": r["metric"],
                "direction": r["direction"], "paths": json.loads(r["paths"]), "n_runs": r["n_runs"],
                "cancel_requested": bool(r["cancel_requested"]), "created_at": r["created_at"],
                "cancelled_at": r["cancelled_at"]}

    def graph(self, sweep_id: str) -> dict[str, Any] | None:
        rows = self.store.query("SELECT graph FROM sweeps WHERE id=?", (sweep_id,))
        return json.loads(rows[0]["graph"]) if rows else None

    def rows(self, sweep_id: str, metric: str) -> list[Row]:
        """Every variant with its run's fields, in variant order."""
        q = self.store.query(
            f"SELECT v.idx, v.point, v.run_id, v.params, v.seed, {_RUN_COLUMNS} FROM sweep_variants v"
            " LEFT JOIN runs r ON r.id = v.run_id WHERE v.sweep_id=? ORDER BY v.idx", (sweep_id,))
        return [_row(r["idx"], r["point"], json.loads(r["params"]), r["seed"], r["run_id"], r, metric) for r in q]

    def active_run_ids(self, sweep_id: str) -> list[str]:
        """The children still queued, assigned or running."""
        return [r["run_id"] for r in self.store.query(
            "SELECT v.run_id FROM sweep_variants v JOIN runs r ON r.id = v.run_id WHERE v.sweep_id=?"
            " AND r.status IN ('queued', 'assigned', 'running')", (sweep_id,))]

    def version(self, sweep_id: str) -> int:
        """Grows whenever a child moves on (assigned, started, ended, deleted) or the sweep is cancelled."""
        q = self.store.query(
            f"SELECT COALESCE(SUM({_MOVES}), 0) + (SELECT cancel_requested FROM sweeps WHERE id=?) AS v"
            " FROM sweep_variants v LEFT JOIN runs r ON r.id = v.run_id WHERE v.sweep_id=?", (sweep_id, sweep_id))
        return int(q[0]["v"] or 0)

    def list(self, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        """Sweeps newest first, each with its children's counts by status."""
        total = int(self.store.query("SELECT COUNT(*) AS n FROM sweeps")[0]["n"])
        sweeps = [self._sweep(r) for r in self.store.query(
            "SELECT * FROM sweeps ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?", (limit, offset))]
        if sweeps:
            marks = ",".join("?" * len(sweeps))
            counts: dict[str, dict[str, int]] = {s["id"]: {} for s in sweeps}
            for r in self.store.query(
                    f"SELECT v.sweep_id AS sid, COALESCE(r.status, 'deleted') AS status, COUNT(*) AS n"
                    f" FROM sweep_variants v LEFT JOIN runs r ON r.id = v.run_id WHERE v.sweep_id IN ({marks})"
                    " GROUP BY v.sweep_id, COALESCE(r.status, 'deleted')", [s["id"] for s in sweeps]):
                counts[r["sid"]][r["status"]] = int(r["n"])
            for s in sweeps:
                s["counts"] = counts[s["id"]]
        return sweeps, total

    def request_cancel(self, sweep_id: str) -> None:
        with self.store.transaction() as db:
            db.execute("UPDATE sweeps SET cancel_requested=1, cancelled_at=COALESCE(cancelled_at, ?) WHERE id=?",
                       (time.time(), sweep_id))

    def delete(self, sweep_id: str) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM sweep_variants WHERE sweep_id=?", (sweep_id,))
            db.execute("DELETE FROM sweeps WHERE id=?", (sweep_id,))


class StudyRecords:
    """Reads and writes of the study tables."""

    def __init__(self, store: Any) -> None:
        self.store = store
        SCHEMA.ensure(store)

    def insert(self, study_id: str, name: str, spec: Mapping[str, Any], graph: Mapping[str, Any],
               optuna_name: str, metric: str, direction: str, paths: Sequence[str], n_trials: int) -> None:
        with self.store.transaction() as db:
            db.execute("INSERT INTO xpufleet_studies(id, name, spec, graph, optuna_name, metric, direction, paths,"
                       " n_trials, status, created_at) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
                       (study_id, name, _dumps(spec), _dumps(graph), optuna_name, metric, direction,
                        _dumps(list(paths)), n_trials, "running", time.time()))

    @staticmethod
    def _study(r: sqlite3.Row) -> dict[str, Any]:
        return {"id": r["id"], "name": r["name"], "spec": json.loads(r["spec"]), "optuna_name": r["optuna_name"],
                "metric": r["metric"], "direction": r["direction"], "paths": json.loads(r["paths"]),
                "n_trials": r["n_trials"], "status": r["status"], "error": r["error"],
                "cancel_requested": bool(r["cancel_requested"]), "created_at": r["created_at"],
                "finished_at": r["finished_at"]}

    def get(self, study_id: str) -> dict[str, Any] | None:
        rows = self.store.query("SELECT * FROM xpufleet_studies WHERE id=?", (study_id,))
        return self._study(rows[0]) if rows else None

    def graph(self, study_id: str) -> dict[str, Any] | None:
        rows = self.store.query("SELECT graph FROM xpufleet_studies WHERE id=?", (study_id,))
        return json.loads(rows[0]["graph"]) if rows else None

    def active(self) -> list[dict[str, Any]]:
        marks = ",".join("?" * len(STUDY_ACTIVE))
        return [self._study(r) for r in self.store.query(
            f"SELECT * FROM xpufleet_studies WHERE status IN ({marks}) ORDER BY created_at", STUDY_ACTIVE)]

    def list(self, limit: int, offset: int) -> tuple[list[dict[str, Any]], int]:
        total = int(self.store.query("SELECT COUNT(*) AS n FROM xpufleet_studies")[0]["n"])
        studies = [self._study(r) for r in self.store.query(
            "SELECT * FROM xpufleet_studies ORDER BY created_at DESC, rowid DESC LIMIT ? OFFSET ?", (limit, offset))]
        for s in studies:
            s["counts"] = {r["state"]: int(r["n"]) for r in self.store.query(
                "SELECT state, COUNT(*) AS n FROM xpufleet_study_trials WHERE study_id=? GROUP BY state", (s["id"],))}
        return studies, total

    def set_status(self, study_id: str, status: str, error: str | None = None) -> None:
        ended = status not in STUDY_ACTIVE
        with self.store.transaction() as db:
            db.execute("UPDATE xpufleet_studies SET status=?, error=COALESCE(?, error),"
                       " finished_at=CASE WHEN ? THEN COALESCE(finished_at, ?) ELSE finished_at END WHERE id=?",
                       (status, error, ended, time.time(), study_id))
            self._changed(db, study_id)

    def request_cancel(self, study_id: str) -> None:
        with self.store.transaction() as db:
            db.execute("UPDATE xpufleet_studies SET cancel_requested=1,"
                       " status=CASE WHEN status='running' THEN 'cancelling' ELSE status END WHERE id=?", (study_id,))
            self._changed(db, study_id)

    @staticmethod
    def _changed(db: sqlite3.Connection, study_id: str) -> None:
        db.execute("UPDATE xpufleet_studies SET changes = changes + 1 WHERE id=?", (study_id,))

    def insert_trial(self, study_id: str, number: int, trial_id: int, run_id: str | None, params: Mapping[str, Any],
                     state: str = "running", reason: str | None = None) -> None:
        now = time.time()
        with self.store.transaction() as db:
            db.execute("INSERT INTO xpufleet_study_trials(study_id, number, trial_id, run_id, params, state, reason,"
                       " created_at, finished_at) VALUES (?,?,?,?,?,?,?,?,?)",
                       (study_id, number, trial_id, run_id, _dumps(dict(params)), state, reason, now,
                        None if state == "running" else now))
            self._changed(db, study_id)

    def mark_pruned(self, study_id: str, number: int, step: int) -> None:
        with self.store.transaction() as db:
            db.execute("UPDATE xpufleet_study_trials SET state='pruned', pruned_step=?, finished_at=?,"
                       " reason=? WHERE study_id=? AND number=?",
                       (step, time.time(), f"pruned at step {step}", study_id, number))
            self._changed(db, study_id)

    def finish_trial(self, study_id: str, number: int, state: str, value: float | None, reason: str | None) -> None:
        with self.store.transaction() as db:
            db.execute("UPDATE xpufleet_study_trials SET state=?, value=?, reason=?, finished_at=? WHERE study_id=?"
                       " AND number=?", (state, value, reason, time.time(), study_id, number))
            self._changed(db, study_id)

    def trials(self, study_id: str) -> list[dict[str, Any]]:
        """Every trial with its run's fields, by trial number."""
        q = self.store.query(
            f"SELECT t.*, {_RUN_COLUMNS} FROM xpufleet_study_trials t LEFT JOIN runs r ON r.id = t.run_id"
            " WHERE t.study_id=? ORDER BY t.number", (study_id,))
        out = []
        for r in q:
            row = _row(r["number"], r["number"], json.loads(r["params"]), None, r["run_id"], r, "")
            out.append({"number": r["number"], "trial_id": r["trial_id"], "run_id": r["run_id"],
                        "state": r["state"], "value": r["value"],
                        "pruned_step": r["pruned_step"], "reason": r["reason"], "row": row,
                        "created_at": r["created_at"], "finished_at": r["finished_at"]})
        return out

    def version(self, study_id: str) -> int:
        """Grows whenever the study or a trial changes, or a trial's run moves on (not with progress)."""
        q = self.store.query(
            f"SELECT s.changes + COALESCE((SELECT SUM({_MOVES}) FROM xpufleet_study_trials t LEFT JOIN runs r"
            " ON r.id = t.run_id WHERE t.study_id = s.id AND t.run_id IS NOT NULL), 0) AS v"
            " FROM xpufleet_studies s WHERE s.id=?", (study_id,))
        return int(q[0]["v"]) if q else 0

    def delete(self, study_id: str) -> None:
        with self.store.transaction() as db:
            db.execute("DELETE FROM xpufleet_study_trials WHERE study_id=?", (study_id,))
            db.execute("DELETE FROM xpufleet_studies WHERE id=?", (study_id,))
