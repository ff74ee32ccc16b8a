"""What the sidecar keeps for memory budgets in SQLite (tables through ``Store.ensure_schema``).

* ``run_memory``: every run's runtime-graph key, number of cards and budget (``Budget.to_json``: the
  value, where it came from, the run whose peak it is, the declared value and the reason of a raise);
* ``memory_peaks``: every finished run's per-card figure with its graph key, number of cards, status and
  what measured it (a CUDA peak, MPS driver-held memory, a simulated card's tensor bytes; none when
  nothing was measured on a card).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...common.schema import Schema
from ..ledger.budget import Budget, MeasuredPeak
from .peaks import CardPeak

SCHEMA = Schema("memory", 1, """
CREATE TABLE IF NOT EXISTS run_memory (
    run_id TEXT PRIMARY KEY,
    graph_key TEXT,
    n_cards INTEGER NOT NULL,
    budget TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS memory_peaks (
    run_id TEXT PRIMARY KEY,
    graph_key TEXT,
    n_cards INTEGER NOT NULL,
    status TEXT NOT NULL,
    peak_gib REAL,
    source TEXT,
    devices TEXT NOT NULL DEFAULT '{}',
    finished_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS memory_peaks_key ON memory_peaks(graph_key, n_cards);
""")


@dataclass(frozen=True)
class RunMemory:
    """One run's graph key (None: the graph has no key), number of cards and budget (None: none)."""

    run_id: str
    graph_key: str | None
    n_cards: int
    budget: Budget | None


class MemoryRecords:
    """The memory tables of one :class:`~xpufleet.server.sidecar.store.Store`."""

    def __init__(self, store: Any) -> None:
        self.store = store
        SCHEMA.ensure(store)

    # --- runs ---------------------------------------------------------------------------------------

    def record_run(self, run_id: str, graph_key: str | None, n_cards: int, budget: Budget | None) -> None:
        with self.store.transaction() as db:
            db.execute("INSERT OR REPLACE INTO run_memory(run_id, graph_key, n_cards, budget, created_at)"
                       " VALUES (?,?,?,?,?)", (run_id, graph_key, int(n_cards),
                                               json.dumps(budget.to_json()) if budget else None, time.time()))

    def set_budget(self, run_id: str, budget: Budget | None) -> None:
        """A run's budget changed (raised, or given the default): its record and the run's columns."""
        with self.store.transaction() as db:
            db.execute("UPDATE run_memory SET budget=? WHERE run_id=?",
                       (json.dumps(budget.to_json()) if budget else None, run_id))
            self.store.set_budget(run_id, budget.gib if budget else None, budget.source if budget else None)

    def runs(self, run_ids: Iterable[str] | None = None) -> dict[str, RunMemory]:
        """The records of ``run_ids`` (every run's when None)."""
        if run_ids is None:
            rows = self.store.query("SELECT * FROM run_memory")
        else:
            ids = list(dict.fromkeys(run_ids))
            rows = []
            for i in range(0, len(ids), 500):  # SQLite's parameter limit
                chunk = ids[i:i + 500]
                rows += self.store.query(
                    f"SELECT * FROM run_memory WHERE run_id IN ({','.join('?' * len(chunk))})", chunk)
        out = {}
        for r in rows:
            budget = Budget.from_json(json.loads(r["budget"])) if r["budget"] else None
            out[r["run_id"]] = RunMemory(r["run_id"], r["graph_key"], int(r["n_cards"]), budget)
        return out

    def run(self, run_id: str) -> RunMemory | None:
        return self.runs([run_id]).get(run_id)

    # --- peaks --------------------------------------------------------------------------------------

    def record_peak(self, run_id: str, graph_key: str | None, n_cards: int, status: str, peak: CardPeak | None,
                    now: float | None = None) -> None:
        with self.store.transaction() as db:
            db.execute(
                "INSERT OR REPLACE INTO memory_peaks(run_id, graph_key, n_cards, status, peak_gib, source, devices,"
                " finished_at) VALUES (?,?,?,?,?,?,?,?)",
                (run_id, graph_key, int(n_cards), status, peak.gib if peak else None, peak.source if peak else None,
                 json.dumps(dict(peak.devices) if peak else {}), time.time() if now is None else now))

    def peaks(self, graph_key: str, n_cards: int) -> list[MeasuredPeak]:
        """The measured figures of finished runs of ``graph_key`` on ``n_cards`` cards."""
        rows = self.store.query(
            "SELECT run_id, peak_gib, source, status FROM memory_peaks WHERE graph_key=? AND n_cards=?"
            " AND peak_gib IS NOT NULL", (graph_key, int(n_cards)))
        return [MeasuredPeak(graph_key, int(n_cards), float(r["peak_gib"]), r["run_id"], r["source"],
                             r["status"] == "succeeded") for r in rows]

    def peaks_of(self, run_ids: Iterable[str]) -> dict[str, dict[str, Any]]:
        """run id -> its recorded figure (finished runs)."""
        ids = list(dict.fromkeys(run_ids))
        out = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i:i + 500]
            for r in self.store.query(
                    f"SELECT * FROM memory_peaks WHERE run_id IN ({','.join('?' * len(chunk))})", chunk):
                out[r["run_id"]] = {"gib": r["peak_gib"], "source": r["source"], "devices": json.loads(r["devices"]),
                                    "status": r["status"]}
        return out

    def forget(self, run_id: str) -> None:
        """A deleted run: its records and its figure go too (no default names a run that is gone)."""
        with self.store.transaction() as db:
            db.execute("DELETE FROM run_memory WHERE run_id=?", (run_id,))
            db.execute("DELETE FROM memory_peaks WHERE run_id=?", (run_id,))
