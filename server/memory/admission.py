"""The dispatcher's memory part (docs/memory.md; docs/workers.md, "sharing a card"): admission by memory on shared cards.

Which cards admit by memory: a CUDA or MPS card whose every online provider has it shared (a worker's
card mode, set in the Workers panel and kept across reconnects and restarts; this server's own card when
``XPUFLEET_LOCAL_SHARED_CARDS`` names it, off by default). One physical card offered by several providers
(same UUID) is one card with one ledger entry. On such a card the memory ledger decides instead of the
slot limit; on every other card the slot rule decides as before. A run's candidates are split
accordingly: the slot queue gets the exclusive ones, the :class:`~..ledger.queue.MemoryQueue` the shared
ones; a device set that mixes both kinds of cards waits with a text saying so.

The ledger is rebuilt whenever the providers change (connect, leave, drain, a card's mode): its cards
from the slot state and the last heartbeat figures, its runs from the runs holding slots (assigned runs
reserved, running ones running: a run taken over after a sidecar restart counts as running at once; a run
without a budget holds its card alone). Heartbeats only update the figures. Budgets come from
:mod:`.submit` at submit time and are raised here while a run waits (:meth:`MemoryAdmission.peak_recorded`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ...common.signals import cancel_and_wait
from ...constants import AGENT_CAP_MEMORY, HEARTBEAT_INTERVAL_S, LOCAL_PROVIDER
from ..ledger.budget import (
    PEAK_SOURCES,
    SIMULATED_SOURCES,
    Budget,
    DefaultBudget,
    default_budget,
    fill_default,
    raise_waiting,
)
from ..ledger.fit import Ledger, context_mib_from_env, short_id
from ..ledger.queue import MemoryHolds, MemoryQueue, MemoryRun
from ..run.events import NewEvent
from ..scheduling import Candidate, SlotState
from ..scheduling.plan import usable_provider
from ..scheduling.waiting import provider_reason
from .outcomes import RunUsage, oom_payload
from .peaks import CardPeak, card_peak
from .records import MemoryRecords, RunMemory
from .texts import memory_text

log = logging.getLogger("xpufleet.memory")

SHAREABLE_KINDS = ("cuda", "mps")


def can_cap(provider: Any) -> bool:
    """Whether a provider caps a run's allocator to its budget (this server: always; an agent: when its
    hello announced it)."""
    return bool(getattr(provider, "is_local", False)) or AGENT_CAP_MEMORY in (getattr(provider, "capabilities", None) or ())


def cap_refusal(provider_name: str) -> str:
    return (f"worker {provider_name} runs an agent that cannot cap a run's memory to its budget (its hello did not "
            f"announce \"{AGENT_CAP_MEMORY}\": an older agent); a budgeted run never starts there: update the agent")


@dataclass
class Split:
    """A run's candidates against the cards' modes: exclusive ones (the slot rule), shared ones (memory),
    and device sets that mix both (they cannot run either way)."""

    slot: list[Candidate] = field(default_factory=list)
    memory: list[Candidate] = field(default_factory=list)
    mixed: list[Candidate] = field(default_factory=list)


@dataclass
class Waiting:
    """A queued run with candidates on shared cards: the usable ones (MemoryQueue's order) and their card
    keys, every shared candidate's keys, the texts of those it cannot use, and whether it has exclusive
    candidates too (the slot rule may place it there)."""

    run_id: str
    cands: list[Candidate]
    keys: list[tuple[str, ...]]
    all_keys: list[tuple[str, ...]]  # every shared candidate, usable or not (for "fits ever")
    notes: list[str]
    has_slot: bool


Holdings = Mapping[str, tuple[str, tuple[str, ...]]]


class MemoryAdmission:
    """The memory part of one :class:`~xpufleet.server.sidecar.dispatcher.Dispatcher` (see the module doc).

    Its dependencies are explicit: ``store`` (the run records and events), ``providers`` (the dispatcher's
    provider table, read only), ``slot_state()`` / ``holdings()`` / ``queued()`` (the slot state, the
    slot holdings and every queued run's candidates), and the calls back: ``wake()`` (plan again),
    ``notify(run_id)`` (the run's watchers), ``end_run(run_id, status, error)`` (the run-events
    interface's end), ``mode_of(worker, device)`` (a worker card's mode, from the registry; None: every
    worker card exclusive). The texts are :mod:`.texts`, per-run NVML use :class:`~.outcomes.RunUsage`."""

    def __init__(self, store: Any, providers: Mapping[str, Any], *, slot_state: Callable[[], SlotState],
                 holdings: Callable[[], Holdings], queued: Callable[[], Mapping[str, tuple[Candidate, ...]]],
                 wake: Callable[[], None], notify: Callable[[str], None],
                 end_run: Callable[[str, str, str | None], None],
                 mode_of: Callable[[str, str], str] | None = None) -> None:
        self.store = store
        self.providers = providers
        self.slot_state = slot_state
        self._holdings = holdings
        self._queued = queued
        self._wake = wake
        self._notify = notify
        self._end_run = end_run
        self.records = MemoryRecords(store)
        try:
            context = context_mib_from_env()
        except ValueError as exc:
            log.warning("%s; using the default", exc)
            context = None
        self.ledger = Ledger() if context is None else Ledger(context)
        self.holds = MemoryHolds()
        self.queue = MemoryQueue(self.ledger, self.holds)
        self.local_shared: frozenset[str] = frozenset()
        self.local_probe: Callable[[], list[dict[str, Any]]] | None = None
        self.probe_every_s = HEARTBEAT_INTERVAL_S  # how often this server's shared cards are read again
        self.mode_of = mode_of  # (worker, device) -> exclusive|shared
        self.keys: frozenset[str] = frozenset()  # the cards that admit by memory
        self.simulated: set[str] = set()
        self.labels: dict[str, str] = {}
        self.figures: dict[str, tuple[float | None, float | None]] = {}  # key -> last (total, free) GiB
        self.info: dict[str, RunMemory] = {}  # queued and active runs
        self.waiting: dict[str, Waiting] = {}
        self.by_graph: dict[tuple[str, int], set[str]] = {}
        self.usage = RunUsage(store.set_execution_facts)  # run id -> NVML per-process figures
        self._serial: int | None = None
        self._dirty: set[str] = set()  # cards whose texts may have changed
        self._task: asyncio.Task[None] | None = None

    # --- configuration and start-up ------------------------------------------------------------------

    def configure(self, local_shared: Iterable[str] = (), local_probe: Callable[[], list[dict[str, Any]]] | None = None,
                  probe_every_s: float = HEARTBEAT_INTERVAL_S) -> None:
        """This server's cards admitted by memory (``XPUFLEET_LOCAL_SHARED_CARDS``) and how to read their
        figures again (None: the figures given at start stay), every ``probe_every_s`` (the heartbeat)."""
        self.local_shared = frozenset(local_shared)
        self.local_probe = local_probe
        self.probe_every_s = probe_every_s

    def load(self) -> None:
        """After a restart: the records of the runs still queued or active."""
        ids = [r for r, _ in self.store.queued()] + [r["id"] for r in self.store.active()]
        self.info.update(self.records.runs(ids))
        for run_id in ids:
            info = self.info.get(run_id)
            if info is not None and info.graph_key is not None:
                self.by_graph.setdefault((info.graph_key, info.n_cards), set()).add(run_id)

    async def start(self) -> None:
        """Re-read this server's shared cards every heartbeat period (only when some are configured)."""
        if self.local_shared and self.local_probe is not None:
            self._task = asyncio.create_task(self._local_loop(), name="xpufleet-local-memory")

    async def shutdown(self) -> None:
        if self._task is not None:
            await cancel_and_wait([self._task])

    async def _local_loop(self) -> None:
        assert self.local_probe is not None
        while True:
            await asyncio.sleep(self.probe_every_s)
            try:
                devices = await asyncio.to_thread(self.local_probe)
            except Exception as exc:  # noqa: BLE001 - a failed probe keeps the last figures
                log.warning("probing this server's shared cards failed: %s", exc)
                continue
            self.report(LOCAL_PROVIDER, devices)

    # --- which cards admit by memory ----------------------------------------------------------------

    def mode(self, provider: Any, device: str) -> str:
        if getattr(provider, "is_local", False):
            return "shared" if device in self.local_shared else "exclusive"
        if self.mode_of is None:
            return "exclusive"
        return self.mode_of(provider.name, device)

    def mode_at(self, provider: str, device: str) -> str:
        """The mode of ``device`` offered by the provider named ``provider`` (one that left: by name only)."""
        return self.mode(self.providers.get(provider) or NamedProvider(provider), device)

    def _details(self) -> dict[tuple[str, str], dict[str, Any]]:
        out = {}
        for p in self.providers.values():
            details = getattr(p, "device_details", None)
            for dev in (details() if details is not None else []):
                out[(p.name, str(dev.get("name")))] = dev
        return out

    def memory_keys(self, state: SlotState) -> frozenset[str]:
        """Cards (slot keys) whose every online provider has them shared; all providers when none is online."""
        keys = set()
        for key, slot in state.slots.items():
            if slot.kind not in SHAREABLE_KINDS:
                continue
            offers = [o for o in slot.offers if o.online] or slot.offers
            if offers and all(self.mode_at(o.provider, o.device) == "shared"
                              for o in offers):
                keys.add(key)
        return frozenset(keys)

    def split(self, cands: Sequence[Candidate], state: SlotState | None = None) -> Split:
        state = state if state is not None else self.slot_state()
        out = Split()
        for c in cands:
            keys = [state.index.get(pair) for pair in c.pairs]  # a spread run: every part's cards
            shared = [k in self.keys for k in keys if k is not None]
            if shared and all(shared) and None not in keys:
                out.memory.append(c)
            elif any(shared):
                out.mixed.append(c)
            else:
                out.slot.append(c)
        return out

    def slot_candidates(self, cands: Sequence[Candidate]) -> tuple[Candidate, ...]:
        return tuple(self.split(cands).slot)

    def keys_of(self, cand: Candidate, state: SlotState | None = None) -> tuple[str, ...]:
        state = state if state is not None else self.slot_state()
        return tuple(k for pair in cand.pairs if (k := state.index.get(pair)) is not None)

    # --- rebuilding the ledger and the queue ---------------------------------------------------------

    def sync(self, state: SlotState, queued: Mapping[str, tuple[Candidate, ...]]) -> bool:
        """The slot state was rebuilt (providers changed): recompute the shared cards, the ledger and the
        queue of runs waiting for memory. Returns True when the set of shared cards changed (the caller
        re-splits the slot queue)."""
        if self._serial == state.serial:
            return False
        self._serial = state.serial
        keys = self.memory_keys(state)
        changed = keys != self.keys
        self.keys = keys
        self._rebuild_ledger(state)
        self._rebuild_queue(state, queued)
        return changed

    def _rebuild_ledger(self, state: SlotState) -> None:
        details = self._details()
        ledger = Ledger(self.ledger.context // (1024 ** 2))
        self.simulated = set()
        for key in self.keys:
            slot = state.slots[key]
            self.labels[key] = slot.label
            figures = self.figures.get(key)
            for o in slot.offers:
                dev = details.get((o.provider, o.device))
                if dev is None:
                    continue
                if dev.get("simulated"):
                    self.simulated.add(key)
                if figures is None:
                    figures = (dev.get("total_gib"), dev.get("free_gib"))
            total, free = figures if figures is not None else (None, None)
            if slot.kind == "mps":
                total = None  # docs/workers.md: a shared MPS device reports no total memory for budgets
            self.figures[key] = figures if figures is not None else (None, None)
            ledger.set_card(key, slot.label, slot.kind, shared=True, total_gib=total, free_gib=free)
        statuses = {r["id"]: r["status"] for r in self.store.active()}
        held: dict[str, list[str]] = {}  # run id -> its shared cards; a spread run's parts under its own id
        for holder, (provider, devices) in self._holdings().items():
            run_id = holder.partition("@")[0]  # "<run id>@<worker>": a spread run's other part (spread.py)
            held.setdefault(run_id, []).extend(
                k for dev in devices if (k := state.index.get((provider, dev))) in self.keys)
        for run_id, keys in held.items():
            run_keys = tuple(dict.fromkeys(keys))
            if not run_keys:
                continue
            info = self.info.get(run_id)
            budget = info.budget.gib if info is not None and info.budget is not None else None
            if statuses.get(run_id) == "assigned":
                ledger.reserve(run_id, run_keys, budget)
            else:  # running, or taken over after a restart: running at once
                ledger.hold_running(run_id, run_keys, budget)
        self.ledger = ledger
        self._dirty |= set(self.keys)

    def _rebuild_queue(self, state: SlotState, queued: Mapping[str, tuple[Candidate, ...]]) -> None:
        self.waiting = {}
        self.queue = MemoryQueue(self.ledger, self.holds)
        for run_id, cands in queued.items():
            self._enqueue(run_id, cands, state)

    def _enqueue(self, run_id: str, cands: Sequence[Candidate], state: SlotState) -> None:
        split = self.split(cands, state)
        if not split.memory and not split.mixed:
            return
        info = self.info.get(run_id)
        if info is not None and info.budget is None and split.memory:
            self._fill_default(run_id, info, split)
            info = self.info.get(run_id)
        budget = info.budget if info is not None else None
        notes: list[str] = []
        usable: list[Candidate] = []
        for c in split.memory:  # a spread run: every part's worker must be usable and cap its run
            away = [(p, prov) for p, _ in c.parts if not usable_provider(prov := state.providers.get(p))]
            uncapped = [p for p, _ in c.parts if not can_cap(self.providers.get(p))]
            if away:
                notes.extend(provider_reason(p, prov) for p, prov in away)
            elif budget is not None and uncapped:
                notes.extend(cap_refusal(p) for p in uncapped)
            else:
                usable.append(c)
        for c in split.mixed:
            notes.append(f"the device set {cand_text(c)} mixes cards shared by memory "
                         f"and exclusive cards: make them all shared or all exclusive to run there")
        w = Waiting(run_id, usable, [self.keys_of(c, state) for c in usable],
                    [self.keys_of(c, state) for c in split.memory], list(dict.fromkeys(notes)), bool(split.slot))
        self.waiting[run_id] = w
        if usable:
            self.queue.add(MemoryRun(run_id, budget.gib if budget is not None else None, tuple(w.keys)))
        for keys in w.all_keys:
            self._dirty.update(keys)

    def _sources(self, keys: Iterable[Sequence[str]]) -> frozenset[str]:
        flat = [k for ks in keys for k in ks]
        return SIMULATED_SOURCES if flat and all(k in self.simulated for k in flat) else PEAK_SOURCES

    def default_for(self, graph_key: str | None, n_cards: int, keys: Iterable[Sequence[str]]) -> DefaultBudget | None:
        """The graph's default budget on ``n_cards`` cards for a run that may use the cards ``keys``."""
        if graph_key is None:
            return None
        return default_budget(self.records.peaks(graph_key, n_cards), graph_key, n_cards, self._sources(keys))

    def _fill_default(self, run_id: str, info: RunMemory, split: Split) -> None:
        """docs/memory.md: a run queued without a budget while its card was exclusive gets the graph's default budget
        when the card turns shared (or later, once the graph has a measured peak on that many cards)."""
        state = self.slot_state()
        default = self.default_for(info.graph_key, info.n_cards, [self.keys_of(c, state) for c in split.memory])
        budget = fill_default(None, default)
        if budget is None:
            return
        budget = Budget(budget.gib, budget.source, budget.from_run, budget.peak_gib, None,
                        "given the graph's default budget: its card is shared by memory", budget.peak_source)
        self._set_budget(run_id, info, budget)

    def _set_budget(self, run_id: str, info: RunMemory, budget: Budget) -> None:
        self.records.set_budget(run_id, budget)
        self.info[run_id] = RunMemory(run_id, info.graph_key, info.n_cards, budget)

        self.store.append_events(run_id, [NewEvent("budget_changed", {**budget.to_json()})])
        self._notify(run_id)

    # --- submission and the dispatcher's calls -------------------------------------------------------

    def admitted(self, run_id: str, info: RunMemory, cands: Sequence[Candidate]) -> None:
        """A run was queued (its records are written): index it and, with shared candidates, queue it."""
        self.info[run_id] = info
        if info.graph_key is not None:
            self.by_graph.setdefault((info.graph_key, info.n_cards), set()).add(run_id)
        self._enqueue(run_id, cands, self.slot_state())

    def plan(self) -> list[tuple[str, Candidate, tuple[str, ...]]]:
        """Place what fits on shared cards now (reserved on the ledger): (run id, candidate, card keys)."""
        out = []
        for p in self.queue.plan():
            w = self.waiting.pop(p.run_id, None)
            if w is None:  # cannot happen: every queued MemoryRun has its entry
                self.ledger.release(p.run_id)
                continue
            out.append((p.run_id, w.cands[p.candidate], p.keys))
            self._dirty.update(p.keys)
        return out

    def placed_elsewhere(self, run_id: str) -> None:
        """The slot rule placed the run on an exclusive card: it no longer waits for memory."""
        if self.waiting.pop(run_id, None) is not None:
            self.queue.remove(run_id)

    def started(self, run_id: str) -> None:
        if run_id in self.ledger.runs:
            self.ledger.start(run_id)
            self._dirty.update(self.ledger.runs[run_id].keys)
            self._wake()

    def release(self, run_id: str) -> None:
        """The run ended, was cancelled, or its start failed: nothing of it is counted any more."""
        held = self.ledger.runs.get(run_id)
        if held is not None:
            self._dirty.update(held.keys)
        self.ledger.release(run_id)
        w = self.waiting.pop(run_id, None)
        if w is not None:
            self.queue.remove(run_id)
            for keys in w.all_keys:
                self._dirty.update(keys)
        info = self.info.pop(run_id, None)
        if info is not None and info.graph_key is not None:
            runs = self.by_graph.get((info.graph_key, info.n_cards))
            if runs is not None:
                runs.discard(run_id)
                if not runs:
                    del self.by_graph[(info.graph_key, info.n_cards)]
        self.usage.forget(run_id)

    def unplaced(self, run_id: str) -> None:
        """A placement that could not be applied (the run was cancelled meanwhile)."""
        self.ledger.release(run_id)

    def budget_to_send(self, run_id: str, keys: Sequence[str]) -> float | None:
        """The budget the run's process is capped to: on a shared card its budget; on an exclusive card only a
        budget the user declared (a default is a memory decision, not a cap for a run that has its card alone)."""
        info = self.info.get(run_id)
        if info is None or info.budget is None:
            return None
        if any(k in self.keys for k in keys) or info.budget.source in ("user", "estimate"):
            return info.budget.gib
        return None

    # --- texts ---------------------------------------------------------------------------------------

    def memory_text(self, run_id: str) -> str | None:
        """Why a run waits for memory (None: it does not): :func:`.texts.memory_text` over this part's state."""
        return memory_text(run_id, self.waiting.get(run_id), self.info.get(run_id), self.ledger, self.holds,
                           self.queue, self.labels)

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

    # --- finished runs, measured peaks and raises -----------------------------------------------------

    def run_usage(self, worker: str, runs: Sequence[Mapping[str, Any]]) -> None:
        """An agent heartbeat's per-run NVML figures (:class:`~.outcomes.RunUsage`)."""
        self.usage.record(worker, runs)

    def finishing(self, run_id: str, payload: dict[str, Any]) -> dict[str, Any]:
        """Before a run's ``run_finished`` is stored: an out-of-memory failure under a budget says where the
        budget came from and asks for a larger ``target.memory_gib`` (:func:`.outcomes.oom_payload`)."""
        info = self.info.get(run_id) or self.records.run(run_id)
        return oom_payload(payload, info, lambda: self.store.get_run(run_id))

    def finished(self, run_id: str, status: str, peak_memory: Any) -> None:
        """A run ended: its per-card figure is recorded under its graph key and number of cards; a larger
        peak of a successful run raises the budgets of the same graph's waiting runs."""
        info = self.info.get(run_id) or self.records.run(run_id)
        if info is None:
            return
        peak = card_peak(peak_memory)
        self.records.record_peak(run_id, info.graph_key, info.n_cards, status, peak)
        if status == "succeeded" and peak is not None and info.graph_key is not None:
            self.peak_recorded(info.graph_key, info.n_cards, run_id, peak)

    def peak_recorded(self, graph_key: str, n_cards: int, run_id: str, peak: CardPeak) -> None:
        """Raise (or give) the budgets of the waiting runs of this graph on this many cards: an estimate or a
        default is raised with the reason, a run whose raised budget no usable card could hold fails, a typed
        budget never changes, and a run that waited without one gets the default (docs/memory.md)."""
        for other in sorted(self.by_graph.get((graph_key, n_cards), set())):
            w = self.waiting.get(other)
            info = self.info.get(other)
            if w is None or info is None or other == run_id:
                continue
            default = self.default_for(graph_key, n_cards, w.all_keys)
            if default is None:
                continue
            if info.budget is None:
                budget = fill_default(None, default)
                if budget is not None:
                    self._set_budget(other, info, Budget(
                        budget.gib, budget.source, budget.from_run, budget.peak_gib, None,
                        f"given the graph's default budget: run {short_id(run_id)} of the same graph succeeded",
                        budget.peak_source))
                    self._requeue(other)
                continue

            def fits_somewhere(gib: float, w: Any = w) -> bool:
                if w.has_slot:
                    return True
                return any(self.ledger.fits_ever(keys, gib) is not False for keys in w.all_keys)

            raised = raise_waiting(info.budget, default, fits_somewhere)
            if raised is None:
                continue
            if raised.fail is not None:
                self._set_budget(other, info, raised.budget)
                self._end_run(other, "failed", raised.fail)
                continue
            self._set_budget(other, info, raised.budget)
            if other in self.queue:
                self.queue.set_budget(other, raised.budget.gib)
            for keys in w.all_keys:
                self._dirty.update(keys)
        self._wake()

    def _requeue(self, run_id: str) -> None:
        """A waiting run's candidates depend on its budget (agents that cannot cap): queue it again in its
        place (the queue is rebuilt in submission order)."""
        self._serial = None
        self._rebuild_queue(self.slot_state(), self._queued())

    # --- heartbeats ----------------------------------------------------------------------------------

    def report(self, provider: str, devices: Sequence[Mapping[str, Any]]) -> None:
        """A heartbeat's figures (or this server's probe): the shared cards' total and free memory."""
        state = self.slot_state()
        for dev in devices:
            key = state.index.get((provider, str(dev.get("name"))))
            if key is None:
                continue
            total, free = dev.get("total_gib"), dev.get("free_gib")
            self.figures[key] = (total, free)
            card = self.ledger.cards.get(key)
            if card is None:
                continue
            before = (card.total, card.free)
            self.ledger.report(key, None if card.kind == "mps" else total, free)
            if (card.total, card.free) != before:
                self._dirty.add(key)
        if self.ledger.grown:
            self._wake()

class NamedProvider:
    """A provider known by name only (one that left): exclusive unless the registry says otherwise."""

    is_local = False

    def __init__(self, name: str) -> None:
        self.name = name


def _where(provider: str) -> str:
    return "this server" if provider == LOCAL_PROVIDER else provider


def cand_text(c: Candidate) -> str:
    """``cuda:0, cuda:1 on gpu-box``; a spread run's parts joined: ``cuda:0 on a + cuda:0, cuda:1 on b``."""
    return " + ".join(f"{', '.join(devs)} on {_where(p)}" for p, devs in c.parts)


def uncapped_parts(adm: MemoryAdmission, cands: Sequence[Candidate]) -> list[str]:
    """The workers of ``cands`` (every part of a spread run) whose agent cannot cap a run to its budget."""
    return list(dict.fromkeys(p for c in cands for p, _ in c.parts if not can_cap(adm.providers.get(p))))
