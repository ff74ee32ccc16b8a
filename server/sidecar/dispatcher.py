"""The queue loop: submitted runs -> the slot rule -> a provider starts them (docs/sidecar.md).

Event-driven: one asyncio task sleeps on an :class:`asyncio.Event` that is set when something can
change a placement (a submission, a run ending, a cancel, a provider connecting, leaving, draining or
changing its devices) and then plans once. Statuses are persisted as runs move
``queued -> assigned -> running -> succeeded|failed|cancelled|interrupted``; a waiting run's
``waiting_reason`` says what it waits for.

It is composed of parts that own their state (docs/architecture.md): the slot book (slots.py: providers,
holdings, slot state), the memory part (:mod:`..memory`), the dynamic runs (dynamic.py), the slot holders
that are not runs (holders.py), the spread runs (spread.py) and restart recovery (recovery.py); each gets its
dependencies in this constructor. Providers report through one run-events interface
(:class:`~.providers.RunHost`: ``ingest``, ``run_process_started``, ``run_ended``), which this class is.

Other issues plug in here: worker providers (:meth:`Dispatcher.register_provider`,
:meth:`providers_changed`), one-shot pools (the ``pools`` view given at construction; pool and mount runs are
resolved again as providers change: dynamic.py), admission by memory on shared
cards (:attr:`Dispatcher.memory`, :mod:`..memory`: it plans the runs' shared candidates before the slot
rule plans the exclusive ones), extra admission predicates (:attr:`Dispatcher.admit_hooks`), card
snapshots for the predictor, and slot holders that are not runs
(inference unit instances: :meth:`Dispatcher.request_slots`, queued in submission order with the runs,
so instances and runs share cards by the same rule); sweeps and studies (:meth:`Dispatcher.admit` for every
child, then :meth:`Dispatcher.enqueue` of the batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...common.errors import RequestError, StoreError
from ...common.signals import cancel_and_wait
from ...constants import (
    CANCEL_BATCH_RUNS,
    LOCAL_PROVIDER,
    RUN_STOP_GRACE_S,
    RUNS_DIR_NAME,
    SWEEP_ADMIT_BATCH,
    TERMINAL_STATUSES,
)
from ..comfyflow.check import provider_verdict
from ..memory.admission import MemoryAdmission
from ..memory.graph_facts import GraphFacts, graph_facts
from ..memory.records import RunMemory
from ..memory.submit import AdmissionError, prepare
from ..run.events import NewEvent
from ..run.requests import RunRequest
from ..scheduling import (
    AdmitFn,
    Candidate,
    LimitOverrides,
    ProviderInfo,
    QueuedRun,
    Resolution,
    RunTarget,
    SlotQueue,
    SlotState,
    TargetError,
    explain_wait,
    resolve_target,
)
from .admissions import Admission, write_runs
from .dynamic import DynamicRuns
from .holders import OnPlaced, OnReason, SlotHolders
from .hub import EventHub
from .pool_table import PoolsView, PoolTable, comfyui_pools
from .recovery import Recovery
from .refusals import refusal, validates_here
from .run_events import RunEvents
from .slots import SlotBook
from .spread import SpreadRuns
from .store import Store
from .tasks import Background
from .workflow_estimate import workflow_peak_gib

log = logging.getLogger("xpufleet.dispatcher")


REASONS_REFRESH_S = 0.5  # waiting_reason texts of runs already explained are refreshed at most this often


# --- the dispatcher -----------------------------------------------------------------------------------


class Dispatcher:
    """Owns the queue and plans it; see the module docstring.

    ``pools``: the one-shot pools as the registry sees them (default: no pools); ``mode_of(worker,
    device)``: a worker card's mode, ``exclusive`` or ``shared`` (default: every worker card exclusive)."""

    def __init__(self, store: Store, home: Path, overrides: LimitOverrides | None = None,
                 validate_local_graphs: bool = True, stop_grace_s: float = RUN_STOP_GRACE_S, *,
                 pools: PoolsView | None = None, mode_of: Callable[[str, str], str] | None = None) -> None:
        self.store = store
        self.home = Path(home)
        self.validate_local_graphs = validate_local_graphs
        self.stop_grace_s = stop_grace_s
        self.hub = EventHub()
        self.slots = SlotBook(overrides)
        self.overrides = self.slots.overrides
        self.providers = self.slots.providers  # name -> provider (the slot book's table)
        self.pool_table = pools if pools is not None else PoolTable()
        self.admit_hooks: list[AdmitFn] = []  # extra admission predicates (memory ledger)
        self.card_snapshot_sources: list[Callable[[], list[dict[str, Any]]]] = []
        self._queue = SlotQueue()
        self._unexplained: set[str] = set()  # queued runs without a waiting_reason yet
        self._reasons_at = float("-inf")  # loop time of the last waiting_reason refresh
        self._reasons_timer: asyncio.TimerHandle | None = None
        self._reasons: dict[str, str | None] = {}
        self._slot_reasons: dict[str, str | None] = {}  # the slot rule's part of a waiting_reason
        self._cands: dict[str, tuple[Candidate, ...]] = {}  # every queued run's candidates, submission order
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._bg = Background()
        self.dynamic = DynamicRuns(store, self.resolve, self.pool_table)  # pool and mount runs (dynamic.py)
        self.holders = SlotHolders()  # slot holders that are not runs (holders.py)
        self.memory = MemoryAdmission(store, self.providers, slot_state=self.slot_state, holdings=self.holdings,
                                      queued=self.queued_candidates, wake=self.wake, notify=self.hub.notify,
                                      end_run=self.run_ended, mode_of=mode_of)
        # The run-events interface providers report to (run_events.py); a spread run's rank 0 events pass
        # through the spread part first.
        self.events = RunEvents(store, self.hub.notify, self.memory, self._release,
                                lambda run_id, events: self.spread.filter(run_id, events))
        self.spread = SpreadRuns(store, self.slots, self.events, self._bg.spawn)  # runs spread over workers
        self.recovery = Recovery(store, self.slots, self.events, self._release, self._bg.spawn, self.hub.notify,
                                 stop_grace_s)
        self.shutting_down = False
        self.plans = 0  # passes made (tests and /api/health)

    # --- providers ------------------------------------------------------------------------------

    def register_provider(self, provider: Any) -> None:
        """Add (or replace) a provider; workers stay registered while offline so their runs wait."""
        self.providers[provider.name] = provider
        self.providers_changed()

    def unregister_provider(self, name: str) -> None:
        self.providers.pop(name, None)
        self.providers_changed()

    def providers_changed(self) -> None:
        """A provider connected, left, started or stopped draining, or changed its devices or mounts
        (pool membership too): re-plan, and resolve the dynamic runs again first."""
        self.slots.invalidate()
        self.dynamic.providers_changed()
        self.wake()

    def explain_again(self, run_ids: list[str]) -> None:
        """Something outside the queue changed what these queued runs wait for (a Slurm job's state):
        their waiting_reason is built again on the next pass."""
        self._unexplained |= {r for r in run_ids if r in self._cands}
        if run_ids:
            self.wake()

    def slot_state(self) -> SlotState:
        """The slot state the queue is planned against (built from the providers when they change,
        then kept current as runs take and release slots); the memory part follows a rebuilt one."""
        state = self.slots.state()
        if self.memory.sync(state, self._cands):
            self._resplit()
        return state

    def _resplit(self) -> None:
        """The cards shared by memory changed: the slot queue gets each run's exclusive candidates again,
        and the waiting slot holders go back in after the runs."""
        self._queue = SlotQueue()
        for run_id, cands in self._cands.items():
            self._queue.add(QueuedRun(run_id, self.memory.slot_candidates(cands)))
        self._unexplained |= set(self._cands)
        for holder_id, cands in self.holders.queued():
            self._queue.add(QueuedRun(holder_id, cands))
            self._unexplained.add(holder_id)

    def holdings(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Run id -> (provider, devices) of every assigned or running run."""
        return self.slots.holdings

    def queued_candidates(self) -> dict[str, tuple[Candidate, ...]]:
        """Every queued run's candidates, in submission order."""
        return self._cands

    def provider_infos(self) -> list[ProviderInfo]:
        return self.slots.infos()

    # --- slot holders that are not runs (holders.py) --------------------------------------------

    def request_slots(self, holder_id: str, candidates: Sequence[Candidate], on_placed: OnPlaced,
                      on_reason: OnReason | None = None) -> None:
        """Queue a holder that is not a run for one of ``candidates``, in submission order with the
        runs; ``on_placed(provider, devices)`` once it holds the slots (until :meth:`release_slots`),
        ``on_reason(text)`` with its waiting reason meanwhile."""
        self._queue.add(QueuedRun(holder_id, self.holders.add(holder_id, candidates, on_placed, on_reason)))
        self._unexplained.add(holder_id)
        self.wake()

    def hold_slots(self, holder_id: str, provider: str, devices: Sequence[str]) -> None:
        """Count ``holder_id`` on the slots of ``devices`` (placed, or taken over after a restart)."""
        self.slots.hold(holder_id, provider, devices)

    def release_slots(self, holder_id: str) -> None:
        """The holder's slots are free again (or its place in the queue is given up)."""
        self.holders.discard(holder_id)
        self._reasons.pop(holder_id, None)
        self._unexplained.discard(holder_id)
        self._release(holder_id)

    def card_snapshots(self) -> list[dict[str, Any]]:
        """Per-card snapshots from every source (workers add theirs); [] until one is registered."""
        out: list[dict[str, Any]] = []
        for source in self.card_snapshot_sources:
            with contextlib.suppress(Exception):
                out.extend(source())
        return out

    # --- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Recover after a restart, load the queue, and start the queue loop."""
        self._wake = asyncio.Event()
        await self.recovery.recover()
        self.memory.load()
        self.spread.recover()
        for run_id, cands in self.store.queued():
            self._cands[run_id] = tuple(Candidate.from_json(c) for c in cands)
        self.dynamic.load()
        self.slot_state()
        self._resplit()
        await self.memory.start()
        self._task = asyncio.create_task(self._loop(), name="xpufleet-dispatcher")
        self.wake()

    async def shutdown(self) -> None:
        """Stop planning; ask providers to stop their runs (local runs end ``interrupted``)."""
        self.shutting_down = True
        if self._reasons_timer is not None:
            self._reasons_timer.cancel()
        if self._task is not None:
            await cancel_and_wait([self._task])
        for p in list(self.providers.values()):
            stop = getattr(p, "shutdown", None)
            if stop is not None:
                try:
                    await stop()
                except Exception:  # noqa: BLE001
                    log.exception("provider %s: shutdown failed", p.name)
        self._bg.cancel_all()
        await self.memory.shutdown()
        self.hub.notify_all()

    def wake(self) -> None:
        if self._wake is not None:
            self._wake.set()

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            await self._wake.wait()
            self._wake.clear()
            try:
                self.schedule()
            except Exception:  # noqa: BLE001 - one bad pass must not stop the queue forever
                log.exception("scheduling pass failed")

    # --- submission -----------------------------------------------------------------------------

    def resolve(self, target: RunTarget, infos: Sequence[ProviderInfo] | None = None) -> Resolution:
        """Candidates for ``target`` against the providers known now (``infos``: a batch's snapshot;
        TargetError -> 400); a ComfyUI run's workflow is checked against each provider's ComfyUI
        (server/comfyflow/check.py)."""
        return resolve_target(target, self.provider_infos() if infos is None else infos, self.pool_table.live(),
                              comfy_check=provider_verdict, comfy_pools=comfyui_pools(self.pool_table))

    def validates(self, resolution: Resolution, target: RunTarget | None = None) -> bool:
        """Whether this server validates the graph of a run with ``resolution`` (refusals.validates_here)."""
        return validates_here(self.validate_local_graphs, resolution, target is not None and target.is_comfyui)

    async def check_graph(self, request: RunRequest) -> GraphFacts | None:
        """The graph's validation (when :meth:`validates`) and key in a worker thread (issue 19: both on
        the loop stalled every heartbeat for seconds on large graphs); raises the validation's 400. Then
        ``submit(request, facts)``. None for a target :meth:`submit` refuses anyway."""
        try:
            resolution = self.resolve(request.target)
        except TargetError:
            return None
        facts = await asyncio.to_thread(graph_facts, request.graph, self.validates(resolution, request.target), False)
        if facts.problem is not None:
            raise facts.problem
        return facts

    def admit(self, request: RunRequest, infos: Sequence[ProviderInfo] | None = None,
              facts: GraphFacts | None = None) -> Admission:
        """The per-run admission check of every way a run is queued (``submit``, and the whole-batch check
        of sweeps and studies, each child as if submitted alone now): the target against the providers
        known now (``infos``: a batch's snapshot), what is refused by name (refusals.py), the graph when it
        can only run here, and the budget and memory decision. Raises RequestError (400, 503); writes
        nothing. ``facts``: the graph's validation and key from a worker thread (graph_facts.py), else
        computed here."""
        if self.shutting_down:
            raise RequestError("the server is stopping; submit again when it is back", status=503)
        try:
            resolution = self.resolve(request.target, infos)
        except TargetError as exc:
            raise RequestError(str(exc)) from None
        refused = refusal(request, resolution, self.pool_table.closed(),
                          lambda name: bool(getattr(self.providers.get(name), "one_shot", False)))
        if refused is not None:
            raise RequestError(refused)
        validates = self.validates(resolution, request.target)
        if facts is None or (validates and not facts.validated):
            facts = graph_facts(request.graph, validates)
        if validates and facts.problem is not None:
            raise facts.problem
        self.spread.check(request, resolution)
        try:  # the budget and the memory decision (docs/memory.md): a rejection writes nothing
            prep = prepare(self.memory, facts.key, request.target, resolution, self.slot_state(),
                           estimate_gib=self._workflow_estimate(request))
        except AdmissionError as exc:
            raise RequestError(str(exc)) from None
        return Admission(request, resolution, prep)

    @staticmethod
    def _workflow_estimate(request: RunRequest) -> Callable[[], float | None] | None:
        """A ComfyUI run's static estimate on a shared card without a measured peak (workflow_estimate.py)."""
        if not request.target.is_comfyui:
            return None
        return lambda: workflow_peak_gib(request.graph)

    def submit(self, request: RunRequest, facts: GraphFacts | None = None) -> dict[str, Any]:
        """Queue a run; raise RequestError (400) for a target or graph this server rejects."""
        return self.enqueue([self.admit(request, facts=facts)])[0]

    def enqueue(self, admissions: Sequence[Admission],
                write_extra: Callable[[list[str]], None] | None = None) -> list[dict[str, Any]]:
        """Write admitted runs (and their memory records) in one store transaction, then add them to the
        queue in one pass.

        ``write_extra(run_ids)`` runs inside the same transaction (a sweep's own rows): if it or any
        insert fails, nothing is written and nothing is queued."""
        if self.shutting_down:
            raise RequestError("the server is stopping; submit again when it is back", status=503)
        return self._queue_runs(admissions, write_runs(self.store, self.memory.records, admissions, write_extra))

    async def enqueue_off_loop(self, admissions: Sequence[Admission],
                               write_extra: Callable[[list[str]], None] | None = None) -> list[dict[str, Any]]:
        """:meth:`enqueue` with the store transaction in a worker thread (a sweep's thousands of inserts
        stalled the loop for seconds, issue 19); once written, the runs join the queue on the loop,
        ``SWEEP_ADMIT_BATCH`` at a time with a yield to it between."""
        if self.shutting_down:
            raise RequestError("the server is stopping; submit again when it is back", status=503)
        async with self.store.acknowledged():  # queued only once in state.db (a refusal: 507/503, nothing queued)
            run_ids = await asyncio.to_thread(write_runs, self.store, self.memory.records, admissions, write_extra)
        out: list[dict[str, Any]] = []
        for start in range(0, len(run_ids), SWEEP_ADMIT_BATCH):
            if start:
                await asyncio.sleep(0)
            end = start + SWEEP_ADMIT_BATCH
            out += self._queue_runs(admissions[start:end], run_ids[start:end])
        return out

    def _queue_runs(self, admissions: Sequence[Admission], run_ids: list[str]) -> list[dict[str, Any]]:
        for a, run_id in zip(admissions, run_ids, strict=True):
            info, cands = a.prepared.info, a.resolution.candidates
            self._cands[run_id] = cands
            self._queue.add(QueuedRun(run_id, self.memory.slot_candidates(cands)))
            self.memory.admitted(run_id, RunMemory(run_id, info.graph_key, info.n_cards, info.budget), cands)
            self._unexplained.add(run_id)
            if a.resolution.dynamic:
                self.dynamic.add(run_id, a.request.target, a.resolution.note)
        self.wake()
        return [{"run_id": run_id, "status": "queued"} for run_id in run_ids]

    # --- planning -------------------------------------------------------------------------------

    def _admit(self, run: QueuedRun, cand: Candidate) -> bool | str | None:
        for hook in self.admit_hooks:
            verdict = hook(run, cand)
            if verdict is not True and verdict is not None:
                return verdict
        return True

    def schedule(self) -> None:
        """One planning pass (the loop calls it on every wake-up)."""
        self.plans += 1
        providers_changed = self.dynamic.due
        if providers_changed:
            self._resolve_dynamic()
        if not self._queue:
            return
        state = self.slot_state()
        for run_id, cand, keys in self.memory.plan():  # shared cards first: the memory ledger decides there
            self._place(run_id, cand.provider, cand.devices, memory_keys=keys, extra=cand.extra)
        result = self._queue.plan(state, admit=self._admit if self.admit_hooks else None, explain=False)
        for placement in result.placements:
            self._place(placement.run_id, placement.provider, placement.devices, extra=placement.extra)
        changed: dict[str, str | None] = {}
        if providers_changed:  # a pass may not look at a run whose providers cannot take it: say why now
            for run_id in self.dynamic.ids():
                run = self._queue.get(run_id)
                if run is not None and run_id not in self._unexplained:
                    slot = self._slot_reasons[run_id] = explain_wait(run, state) if run.candidates else None
                    text = self._waiting_text(run_id, self.memory.reason(run_id, slot))
                    if self._reasons.get(run_id) != text:
                        self._reasons[run_id] = changed[run_id] = text
        for run_id in list(self._unexplained):  # a new run gets its reason at once
            self._unexplained.discard(run_id)
            run = self._queue.get(run_id)
            if run is not None:
                slot = self._slot_reasons[run_id] = result.explain(run) if run.candidates else None
                self._reasons[run_id] = changed[run_id] = self._waiting_text(run_id, self.memory.reason(run_id, slot))
        # The others are refreshed at most every REASONS_REFRESH_S: placements never wait for texts.
        loop = asyncio.get_running_loop()
        since = loop.time() - self._reasons_at
        dirty = self.memory.has_dirty
        if (result.blocked or dirty) and since >= REASONS_REFRESH_S:
            self._reasons_at = loop.time()
            slot_texts = result.reasons()
            self._slot_reasons.update((r, t) for r, t in slot_texts.items() if r in self._queue)
            for run_id in set(slot_texts) | self.memory.dirty_runs():
                if run_id not in self._queue:
                    continue
                reason = self._waiting_text(run_id, self.memory.reason(run_id, self._slot_reasons.get(run_id)))
                if self._reasons.get(run_id) != reason:
                    self._reasons[run_id] = changed[run_id] = reason
        elif (result.blocked or dirty) and self._reasons_timer is None:
            self._reasons_timer = loop.call_later(REASONS_REFRESH_S - since, self._reasons_due)
        self.holders.tell(changed)
        if changed:
            self.store.set_waiting_reasons(changed)

    def _resolve_dynamic(self) -> None:
        """Resolve the dynamic runs again (dynamic.py): a run that became impossible fails with the reason;
        when some run's candidates changed, the queue is rebuilt in submission order."""
        changed, failed = self.dynamic.resolve(self._cands)
        for run_id, why in failed:
            self.run_ended(run_id, "failed", why)
        if not changed:
            return
        self._cands.update(changed)  # same keys: the submission order is kept
        self.store.set_candidates({rid: [c.to_json() for c in cands] for rid, cands in changed.items()})
        self.slot_state()  # providers changed: the slot state and the memory queue follow the new candidates
        self._resplit()

    def _waiting_text(self, run_id: str, planned: str | None) -> str | None:
        return self.dynamic.waiting_text(run_id, planned, self._queue.get(run_id))

    def _reasons_due(self) -> None:
        self._reasons_timer = None
        self.wake()

    def _place(self, run_id: str, provider_name: str, devices: tuple[str, ...],
               memory_keys: tuple[str, ...] | None = None, extra: tuple[Any, ...] = ()) -> None:
        on_placed = self.holders.take(run_id)
        if on_placed is not None:  # not a run: the slots are held, the holder starts its own process
            self._queue.remove(run_id)
            self._reasons.pop(run_id, None)
            self.hold_slots(run_id, provider_name, devices)
            on_placed(provider_name, tuple(devices))
            return
        provider = self.providers.get(provider_name)
        claim = getattr(provider, "claim", None)  # a one-shot instance takes one run, ever
        if claim is not None:
            if not claim(run_id):
                if memory_keys is not None:
                    self.memory.unplaced(run_id)
                self.providers_changed()  # it took another run in this pass: plan this one again
                return
            if getattr(provider, "one_shot", False):
                self.providers_changed()  # it takes no other run from now on
        self.dynamic.forget(run_id)
        placement = "local" if getattr(provider, "is_local", False) else "worker"
        run_dir = str(self.home / RUNS_DIR_NAME / run_id) if placement == "local" else None
        self._queue.remove(run_id)
        self._cands.pop(run_id, None)
        self._reasons.pop(run_id, None)
        self._slot_reasons.pop(run_id, None)
        if memory_keys is None:
            self.memory.placed_elsewhere(run_id)
        if provider is None or not self.store.assign(run_id, provider=provider_name, placement=placement,
                                                      devices=list(devices), run_dir=run_dir):
            if memory_keys is not None:
                self.memory.unplaced(run_id)
            return
        self.slots.hold(run_id, provider_name, devices)
        self.hub.notify(run_id)
        # the cap the run's process gets (a default is never a cap on an exclusive card); a spread run's parts too
        keys = memory_keys if memory_keys is not None else self.memory.keys_of(Candidate(provider_name, devices, extra))
        budget = self.memory.budget_to_send(run_id, keys)
        layout = self.spread.placed(run_id, provider_name, devices, extra, budget) if extra else None
        run = self.store.get_run(run_id)  # the graph is read off the loop when the run starts (_start_on)
        if run is not None:  # start_run carries the layout: rank 0's worker of a run spread over workers
            run.update({"budget_gib": budget}, **({"spread": layout} if layout is not None else {}))
        self._bg.spawn(self._start_on(provider, run, list(devices)))

    async def _start_on(self, provider: Any, run: dict[str, Any], devices: list[str]) -> None:
        try:
            full = await asyncio.to_thread(self.store.get_run, run["id"], with_graph=True)  # a large graph's
            run["graph"] = (full or {}).get("graph", {})  # decoding took seconds on the loop (issue 19)
            await provider.start_run(run, devices)
        except Exception as exc:  # noqa: BLE001 - report it on the run, keep the queue going
            log.exception("run %s: could not start on %s", run["id"], provider.name)
            where = "this server" if getattr(provider, "is_local", False) else f"worker {provider.name}"
            self.run_ended(run["id"], "failed", f"could not start the run on {where}: {type(exc).__name__}: {exc}")

    # --- the run-events interface (run_events.py), for callers that hold the dispatcher -------------

    def ingest(self, run_id: str, events: Sequence[Mapping[str, Any]]) -> None:
        self.events.ingest(run_id, events)

    def run_process_started(self, run_id: str, pid: int | None = None) -> None:
        self.events.run_process_started(run_id, pid)

    def run_ended(self, run_id: str, status: str, error: str | None) -> None:
        self.events.run_ended(run_id, status, error)

    def _release(self, run_id: str) -> None:
        self.spread.release(run_id)
        self.dynamic.forget(run_id)
        self.memory.release(run_id)
        self._cands.pop(run_id, None)
        if self.slots.release(run_id):
            self.wake()
        elif self._queue.remove(run_id) is not None:
            self.wake()

    # --- cancel / delete --------------------------------------------------------------------------

    async def cancel(self, run_id: str, reason: str | None = None) -> dict[str, Any]:
        """Cancel: a queued run ends now; a started one gets a cooperative stop (interrupt checkpoint)."""
        run = self.store.get_run(run_id)
        if run is None:
            raise StoreError(f"no run {run_id!r}", 404)
        if run["status"] in TERMINAL_STATUSES:
            raise StoreError(f"run {run_id} already ended ({run['status']}); nothing to cancel", 409)
        self.store.request_cancel(run_id)
        why = f"cancelled: {reason}" if reason else None
        if run["status"] == "queued":
            self._queue.remove(run_id)
            self._reasons.pop(run_id, None)
            self.store.finish(run_id, "cancelled", error=why or "cancelled while queued")
            self._release(run_id)
            self.wake()
        else:
            self.store.append_events(run_id, [NewEvent("cancel_requested", {"reason": reason})])
            provider = self.providers.get(run["worker_id"] or LOCAL_PROVIDER)
            if provider is None:
                self.run_ended(run_id, "cancelled", why or "cancelled (its worker is gone)")
            else:
                await provider.cancel(run_id)
        self.hub.notify(run_id)
        return self.store.get_run(run_id) or run

    async def cancel_queued(self, run_ids: Sequence[str], reason: str | None = None) -> set[str]:
        """Cancel many queued runs (a sweep's children) as :meth:`cancel` does one: all leave the queue at
        once, so none can start meanwhile, then their records end in transactions of
        ``CANCEL_BATCH_RUNS`` each in a worker thread, the loop free between them (issue 19: 5,000 one by
        one stalled it for 7 s). Returns the runs it ended; one that was no longer queued is left out."""
        why = f"cancelled: {reason}" if reason else "cancelled while queued"
        for run_id in run_ids:
            self._queue.remove(run_id)
            self._reasons.pop(run_id, None)
        ended: set[str] = set()
        for start in range(0, len(run_ids), CANCEL_BATCH_RUNS):
            batch = run_ids[start:start + CANCEL_BATCH_RUNS]
            done = await asyncio.to_thread(self.store.end_queued, batch, "cancelled", why)
            for run_id in done:
                self._release(run_id)
                self.hub.notify(run_id)
            ended.update(done)
        self.wake()
        return ended

    def delete(self, run_id: str) -> dict[str, Any]:
        """Delete a finished run (record, events, local run directory)."""
        run = self.store.delete_run(run_id)
        self.memory.records.forget(run_id)
        runs_root = (self.home / RUNS_DIR_NAME).resolve()
        # a worker run has a folder here too when its recorded outputs were uploaded
        path = Path(run.get("run_dir") or runs_root / run_id).resolve()
        if path.parent == runs_root and path.name == run_id:
            shutil.rmtree(path, ignore_errors=True)
        self.hub.notify(run_id)
        return run

    def queue_length(self) -> int:
        return len(self._queue)

    def queue_position(self, run_id: str) -> int | None:
        """1-based position among queued runs (None when not queued)."""
        return self._queue.position(run_id)
