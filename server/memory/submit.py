"""A submitted run's budget and its admission by memory (docs/memory.md; docs/workers.md, "sharing a card").

:func:`prepare` runs before the run is written (so a rejection leaves nothing behind):

* the number of cards (a device set's length; a spread run's cards on every worker, each part's cards
  checked and counted like a device set's; the runtime-graph key comes computed by :func:`key_of`, in a
  worker thread);
* the budget (:func:`~..ledger.budget.resolve_budget`): typed, the graph's default (measured peak + 20%),
  or an estimate raised to a larger default; on shared cards only, no peak and no budget is rejected,
  asking for one; a run that only has exclusive cards gets no default (it holds its card alone);
* ``memory_gib`` on a run this server may run itself is refused unless this server's card admits by
  memory (``XPUFLEET_LOCAL_SHARED_CARDS``, off by default);
* a budgeted run never goes to an agent that cannot cap its allocator;
* the decision: a run for a named worker (or this server) is rejected at once when its budget does not
  fit now, unless ``target.wait`` is true; ``any`` (and a pool) waits unless the budget is larger than
  every candidate or ``target.wait`` is false. The 400 carries the ledger's text with both figures (docs/memory.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ...constants import ENV_LOCAL_SHARED_CARDS, LOCAL_PROVIDER
from ..ledger.budget import Budget, BudgetError, resolve_budget
from ..ledger.graph_key import graph_key
from ..scheduling import Candidate, Resolution, SlotState
from .admission import MemoryAdmission, cand_text, cap_refusal, uncapped_parts
from .records import RunMemory

log = logging.getLogger("xpufleet.memory")


class AdmissionError(ValueError):
    """A run rejected for its memory (400); the text says what to change."""


@dataclass(frozen=True)
class Prepared:
    """What :func:`prepare` decided: the run's memory record and the candidates it keeps."""

    info: RunMemory
    candidates: tuple[Candidate, ...]

    @property
    def budget(self) -> Budget | None:
        return self.info.budget


def key_of(graph: Any) -> str | None:
    """The graph's runtime key, or None when it has none (a graph the key cannot read)."""
    try:
        return graph_key(graph)
    except ValueError:
        return None
    except Exception:  # noqa: BLE001 - a node module that fails to import must not block submissions
        log.exception("the runtime-graph key could not be computed")
        return None


def prepare(adm: MemoryAdmission, key: str | None, target: Any, resolution: Resolution,
            state: SlotState, estimate_gib: Callable[[], float | None] | None = None) -> Prepared:
    """Decide a submitted run's budget and admission (see the module docstring); raise AdmissionError.
    ``key``: the graph's runtime key (:func:`key_of`, computed off the event loop by the caller);
    ``estimate_gib``: a ComfyUI workflow's static estimate (resolve_budget), asked only when needed."""
    cands = tuple(resolution.candidates)
    n_cards = len(cands[0].pairs) if cands else 1  # a spread run: every part's cards (its world size)
    split = adm.split(cands, state)
    if target.memory_gib is not None:
        local = [c for c in cands if c.provider == LOCAL_PROVIDER and c not in split.memory]
        if local:
            dev = local[0].devices[0]
            raise AdmissionError(
                f"options.target.memory_gib on a run this server may run on its own {dev}: memory admission for "
                f"this server's cards is off ({ENV_LOCAL_SHARED_CARDS}={dev} turns it on for that card); send the "
                f"run to a worker with options.target.worker, or leave memory_gib out")
    if split.mixed and not split.memory and not split.slot:  # (no candidate at all: a pool/mount run waits)
        texts = "; ".join(cand_text(c) for c in split.mixed)
        raise AdmissionError(f"the device set mixes cards shared by memory and exclusive cards ({texts}): make "
                             f"them all shared or all exclusive")
    budget: Budget | None = None
    mem_keys = [adm.keys_of(c, state) for c in split.memory]
    if split.memory or target.memory_gib is not None:
        default = adm.default_for(key, n_cards, mem_keys)
        try:
            budget = resolve_budget(target.memory_gib, target.memory_source, default, n_cards=n_cards,
                                    shared_only=bool(split.memory) and not split.slot, estimate_gib=estimate_gib)
        except BudgetError as exc:
            raise AdmissionError(str(exc)) from None
    if target.memory_gib is not None:  # a typed budget caps the run wherever it goes: only agents that can
        uncapped = uncapped_parts(adm, split.slot)
        if uncapped:
            raise AdmissionError("; ".join(cap_refusal(p) for p in uncapped))
    if split.memory and budget is not None:  # a spread run caps on every part's worker
        capable = [c for c in split.memory if not uncapped_parts(adm, [c])]
        if not capable and not split.slot:
            raise AdmissionError("; ".join(cap_refusal(p) for p in uncapped_parts(adm, split.memory)))
        keys = [adm.keys_of(c, state) for c in capable]
        if keys and not split.slot:
            named = target.worker != "any" and target.pool is None
            decision = adm.ledger.decide(budget.gib, keys, named=named, wait=target.wait)
            if decision.action == "reject":
                message = decision.message or "the budget does not fit"
                if budget.reason:
                    message += f" (budget {budget.label()}: {budget.reason})"
                raise AdmissionError(message)
    return Prepared(RunMemory("", key, n_cards, budget), cands)
