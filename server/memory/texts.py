"""Why a run waits for memory (plain functions over :class:`~.admission.MemoryAdmission`'s state): the ledger's
texts for each usable candidate (``needs ... GiB (+0.8 GiB CUDA context), ... has ... GiB free (runs ...)``, a card
not reported yet, a shared MPS card, a card held by a run without a budget), a hold for an earlier overtaken
run, the candidates that cannot be used (a worker away or draining, an agent that cannot cap), and the
reason of a raised budget."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from ..ledger.fit import FITS, MAX_REASONS, Ledger, short_id, to_bytes
from ..ledger.queue import MemoryHolds, MemoryQueue
from .records import RunMemory


class WaitingEntry(Protocol):
    """What the texts read of a run waiting for memory (:class:`~.admission.Waiting`)."""

    keys: list[tuple[str, ...]]
    notes: list[str]


def hold_text(run_id: str, keys: Sequence[str], holds: MemoryHolds, queue: MemoryQueue,
              labels: Mapping[str, str]) -> str | None:
    """A card of ``keys`` held for an earlier run that was overtaken there (None: no such hold)."""
    for key in keys:
        holder = holds.holder(key)
        if holder is not None and holder != run_id:
            seq_h, seq_r = queue.seq_of(holder), queue.seq_of(run_id)
            if seq_h is not None and seq_r is not None and seq_h < seq_r:
                n = holds.overtaken.get((holder, key), 0)
                return (f"{labels.get(key, key)} is held for run {short_id(holder)}, submitted earlier and "
                        f"overtaken there {n} times: no later run starts there until it starts")
    return None


def memory_text(run_id: str, w: WaitingEntry | None, info: RunMemory | None, ledger: Ledger, holds: MemoryHolds,
                queue: MemoryQueue, labels: Mapping[str, str]) -> str | None:
    """Why a run waits for memory (None: it does not); ``w``: its waiting entry, ``info``: its budget."""
    if w is None:
        return None
    budget = info.budget.gib if info is not None and info.budget is not None else None
    raw = to_bytes(budget) if budget is not None else None
    texts: list[str] = []
    extra = 0
    for keys in w.keys:
        status = ledger.candidate_status(keys, raw)
        text = hold_text(run_id, keys, holds, queue, labels) if status == FITS else ledger.candidate_text(keys, raw)
        if text is None:
            text = "it fits now and starts at the next scheduling pass"
        if text in texts:
            continue
        if len(texts) >= MAX_REASONS:
            extra += 1
        else:
            texts.append(text)
    shown = "; ".join(texts) + (f"; and {extra} other candidate{'s' if extra != 1 else ''}" if extra else "")
    parts = [f"waiting for memory: {shown}"] if shown else []
    held = holds.held_by(run_id)
    if held:
        n = max(holds.overtaken.get((run_id, k), 0) for k in held)
        parts.insert(0, f"holding {', '.join(labels.get(k, k) for k in held)} for this run (overtaken {n} "
                        f"times): later runs do not start there until it starts")
    parts += w.notes
    if info is not None and info.budget is not None and info.budget.reason:
        parts.append(f"budget {info.budget.label()}: {info.budget.reason}")
    return "; ".join(parts) if parts else None
