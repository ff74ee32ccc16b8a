"""The memory tables: each run's key, cards and budget; every finished run's figure; a deleted run forgotten."""

from __future__ import annotations

from xpufleet.server.ledger.budget import Budget
from xpufleet.server.memory.peaks import CardPeak
from xpufleet.server.memory.records import MemoryRecords
from xpufleet.server.sidecar.store import Store


def test_runs_budgets_and_peaks_round_trip(tmp_path):
    store = Store(tmp_path / "state.db")
    rec = MemoryRecords(store)
    run_id = store.create_run(graph={"1": {"class_type": "X"}}, options={}, target="gpu-box", requested=["cuda:1"],
                              candidates=[], queue_key="gpu-box/cuda:1", budget_gib=3.0, budget_source="estimate")
    rec.record_run(run_id, "g1-key", 2, Budget(3.0, "estimate"))
    raised = Budget(6.0, "measured", "a1b2c3d4e5", 5.0, 3.0, "raised from the estimate", None)
    rec.set_budget(run_id, raised)
    got = rec.run(run_id)
    assert (got.graph_key, got.n_cards, got.budget) == ("g1-key", 2, raised)
    row = store.get_run(run_id)
    assert (row["budget_gib"], row["budget_source"]) == (6.0, "measured")
    rec.record_peak(run_id, "g1-key", 2, "succeeded", CardPeak(5.0, "cuda", {"cuda:0": 5.0, "cuda:1": 4.0}))
    rec.record_peak("other", "g1-key", 2, "failed", None)
    peaks = rec.peaks("g1-key", 2)
    assert [(p.run_id, p.peak_gib, p.source, p.succeeded) for p in peaks] == [(run_id, 5.0, "cuda", True)]
    assert rec.peaks("g1-key", 1) == [] and rec.peaks_of([run_id, "other"])["other"]["gib"] is None
    rec.forget(run_id)
    assert rec.run(run_id) is None and rec.peaks("g1-key", 2) == []
    store.close()
