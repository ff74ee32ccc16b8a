"""Why a run waits for memory (a mixin of :class:`~.admission.MemoryAdmission`): the ledger's texts for each
usable candidate (the seed's ``needs ... GiB (+0.8 GiB CUDA context), ... has ... GiB free (runs ...)``, a card
not reported yet, a shared MPS card, a card held by a run without a budget), a hold for an earlier overtaken
run, the candidates that cannot be used (a worker away or draining, an agent that cannot cap), and the
reason of a raised budget."""

from __future__ import annotations

from collections.abc import Sequence

from ..ledger.fit import FITS, MAX_REASONS, short_id, to_bytes


class WaitingTexts:
    """The waiting_reason texts (mixed into :class:`~.admission.MemoryAdmission`)."""

    def _hold_text(self, run_id: str, keys: Sequence[str]) -> str | None:
        for key in keys:
            holder = self.holds.holder(key)
            if holder is not None and holder != run_id:
                seq_h, seq_r = self.queue.seq_of(holder), self.queue.seq_of(run_id)
                if seq_h is not None and seq_r is not None and seq_h < seq_r:
                    n = self.holds.overtaken.get((holder, key), 0)
                    return (f"{self.labels.get(key, key)} is held for run {short_id(holder)}, submitted earlier and "
                            f"overtaken there {n} times: no later run starts there until it starts")
        return None

    def memory_text(self, run_id: str) -> str | None:
        """Why a run waits for memory (None: it does not)."""
        w = self.waiting.get(run_id)
        if w is None:
            return None
        info = self.info.get(run_id)
        budget = info.budget.gib if info is not None and info.budget is not None else None
        raw = to_bytes(budget) if budget is not None else None
        texts: list[str] = []
        extra = 0
        for keys in w.keys:
            status = self.ledger.candidate_status(keys, raw)
            text = self._hold_text(run_id, keys) if status == FITS else self.ledger.candidate_text(keys, raw)
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
        held = self.holds.held_by(run_id)
        if held:
            n = max(self.holds.overtaken.get((run_id, k), 0) for k in held)
            parts.insert(0, f"holding {', '.join(self.labels.get(k, k) for k in held)} for this run (overtaken {n} "
                            f"times): later runs do not start there until it starts")
        parts += w.notes
        if info is not None and info.budget is not None and info.budget.reason:
            parts.append(f"budget {info.budget.label()}: {info.budget.reason}")
        return "; ".join(parts) if parts else None

    def reason(self, run_id: str, slot_reason: str | None) -> str | None:
        """A queued run's waiting_reason: the memory text, then the slot rule's when it has exclusive cards too."""
        w = self.waiting.get(run_id)
        if w is None:
            return slot_reason
        text = self.memory_text(run_id)
        if w.has_slot and slot_reason:
            return f"{text}; {slot_reason}" if text else slot_reason
        return text

    @property
    def has_dirty(self) -> bool:
        return bool(self._dirty)

    def dirty_runs(self) -> set[str]:
        """Waiting runs whose memory text may have changed since the last call."""
        dirty, self._dirty = self._dirty, set()
        if not dirty:
            return set()
        return {r for r, w in self.waiting.items() if any(k in dirty for keys in w.all_keys for k in keys)}
