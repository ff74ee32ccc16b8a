"""Admitted runs (docs/sidecar.md): what :meth:`~.dispatcher.Dispatcher.admit` decided, and how a batch of them
is written in one store transaction (a submission, a sweep's or a study's children)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..memory.records import MemoryRecords
from ..memory.submit import Prepared
from ..run.requests import RunRequest
from ..scheduling import Resolution
from .store import Store


@dataclass(frozen=True)
class Admission:
    """A run request that passed :meth:`Dispatcher.admit`: where it may go and its budget (not written)."""

    request: RunRequest
    resolution: Resolution
    prepared: Prepared  # the budget and the memory decision


def write_runs(store: Store, records: MemoryRecords, admissions: Sequence[Admission],
               write_extra: Callable[[list[str]], None] | None) -> list[str]:
    """Write admitted runs and their memory records in one transaction; ``write_extra(run_ids)`` inside it
    (a sweep's own rows): if it or any insert fails, nothing is written. Returns the new run ids in order."""
    with store.transaction():
        run_ids = []
        for a in admissions:
            budget = a.prepared.budget
            run_id = store.create_run(
                graph=a.request.graph,
                options=a.request.options,
                target=a.resolution.target,
                requested=list(a.resolution.requested),
                candidates=[c.to_json() for c in a.resolution.candidates],
                queue_key=a.resolution.queue_key,
                name=a.request.name,
                seed=a.request.seed,
                budget_gib=budget.gib if budget else None,
                budget_source=budget.source if budget else None,
                warnings=list(a.resolution.warnings),
            )
            info = a.prepared.info
            records.record_run(run_id, info.graph_key, info.n_cards, budget)
            run_ids.append(run_id)
        if write_extra is not None:
            write_extra(run_ids)
    return run_ids
