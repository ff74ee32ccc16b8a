"""The queue loop: submitted runs -> the slot rule -> a provider starts them (SPEC Q1-Q5).

Event-driven: one asyncio task sleeps on an :class:`asyncio.Event` that is set when something can
change a placement (a submission, a run ending, a cancel, a provider connecting, leaving, draining or
changing its devices) and then plans once. Statuses are persisted as runs move
``queued -> assigned -> running -> succeeded|failed|cancelled|interrupted``; a waiting run's
``waiting_reason`` says what it waits for.

Other issues plug in here: worker providers (:meth:`Dispatcher.register_provider`,
:meth:`providers_changed`), one-shot pools (:attr:`Dispatcher.pools`), the memory ledger
(:attr:`Dispatcher.admit_hooks`, extra admission predicates), card snapshots for the predictor, sweeps
and studies (:meth:`Dispatcher.admit` for every child, then :meth:`Dispatcher.enqueue` of the batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...constants import LOCAL_PROVIDER, RUN_STOP_GRACE_S, RUNS_DIR_NAME, TERMINAL_STATUSES
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
    build_state,
    resolve_target,
)
from .hub import EventHub
from .providers import provider_info
from .requests import RequestError, RunRequest, not_available
from .store import NewEvent, Store, StoreError

log = logging.getLogger("xpufleet.dispatcher")


@dataclass(frozen=True)
class Admission:
    """A run request that passed :meth:`Dispatcher.admit`: where it may go and its budget (not written)."""

    request: RunRequest
    resolution: Resolution
    budget_gib: float | None
    budget_source: str | None

REASONS_REFRESH_S = 0.5  # waiting_reason texts of runs already explained are refreshed at most this often


# --- the dispatcher -----------------------------------------------------------------------------------


class Dispatcher:
    """Owns the queue, the slot holdings and the providers; see the module docstring."""

    def __init__(self, store: Store, home: Path, overrides: LimitOverrides | None = None,
                 validate_local_graphs: bool = True, stop_grace_s: float = RUN_STOP_GRACE_S) -> None:
        self.store = store
        self.home = Path(home)
        self.overrides = overrides or LimitOverrides()
        self.validate_local_graphs = validate_local_graphs
        self.stop_grace_s = stop_grace_s
        self.hub = EventHub()
        self.providers: dict[str, Any] = {}
        self.pools: dict[str, list[str]] = {}  # one-shot worker pools (filled by the worker issue)
        self.admit_hooks: list[AdmitFn] = []  # extra admission predicates (memory ledger)
        self.card_snapshot_sources: list[Callable[[], list[dict[str, Any]]]] = []
        self._queue = SlotQueue()
        self._unexplained: set[str] = set()  # queued runs without a waiting_reason yet
        self._state: SlotState | None = None  # rebuilt when providers change, else kept up to date
        self._reasons_at = float("-inf")  # loop time of the last waiting_reason refresh
        self._reasons_timer: asyncio.TimerHandle | None = None
        self._holdings: dict[str, tuple[str, tuple[str, ...]]] = {}
        self._reasons: dict[str, str | None] = {}
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._bg: set[asyncio.Task[Any]] = set()
        self._last_state_warnings: list[str] = []
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
        """A provider connected, left, started or stopped draining, or changed its devices."""
        self._state = None
        self.wake()

    def slot_state(self) -> SlotState:
        """The slot state the queue is planned against (built from the providers when they change,
        then kept current as runs take and release slots)."""
        if self._state is None:
            self._state = build_state(self.provider_infos(), self.overrides, self._holdings)
            if self._state.warnings != self._last_state_warnings:
                for w in self._state.warnings:
                    log.warning("slot limits: %s", w)
                self._last_state_warnings = list(self._state.warnings)
        return self._state

    def provider_infos(self) -> list[ProviderInfo]:
        return [provider_info(p) for p in self.providers.values()]

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
        await self._recover()
        for run_id, cands in self.store.queued():
            self._queue.add(QueuedRun(run_id, tuple(Candidate.from_json(c) for c in cands)))
            self._unexplained.add(run_id)
        self._task = asyncio.create_task(self._loop(), name="xpufleet-dispatcher")
        self.wake()

    async def shutdown(self) -> None:
        """Stop planning; ask providers to stop their runs (local runs end ``interrupted``)."""
        self.shutting_down = True
        if self._reasons_timer is not None:
            self._reasons_timer.cancel()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for p in list(self.providers.values()):
            stop = getattr(p, "shutdown", None)
            if stop is not None:
                try:
                    await stop()
                except Exception:  # noqa: BLE001
                    log.exception("provider %s: shutdown failed", p.name)
        for t in list(self._bg):
            t.cancel()
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

    def resolve(self, target: RunTarget) -> Resolution:
        """Candidates for ``target`` against the providers known now (TargetError -> 400)."""
        return resolve_target(target, self.provider_infos(), self.pools)

    def validate_graph(self, request: RunRequest, resolution: Resolution) -> None:
        """Check the graph against this server's node classes when it can only run here."""
        if not self.validate_local_graphs or any(c.provider != LOCAL_PROVIDER for c in resolution.candidates):
            return
        from ..run.executor import GraphValidationError, format_errors, validate_graph
        from ..run.executor import validation_response as _response

        try:
            errors = validate_graph(request.graph)
        except GraphValidationError as exc:
            raise RequestError("graph: " + format_errors(exc.response), {"node_errors": exc.response.get(
                "node_errors", {}), "validation": exc.response}) from None
        if errors:
            response = _response(errors)
            raise RequestError("graph: " + format_errors(response),
                               {"node_errors": response["node_errors"], "validation": response})

    def admit(self, request: RunRequest, infos: Sequence[ProviderInfo] | None = None) -> Admission:
        """The per-run admission check of a submission: its target against the providers known now
        (``infos``: a snapshot the caller took for a whole batch), the graph when it can only run here,
        and what is refused by name. Raises RequestError (400, 503); writes nothing.

        The one check for every way a run is queued: ``submit`` (``POST /api/runs``) and the whole-batch
        check of sweeps and studies (SPEC Q6) both call it for every run before anything is written."""
        if self.shutting_down:
            raise RequestError("the server is stopping; submit again when it is back", status=503)
        try:
            resolution = resolve_target(request.target, self.provider_infos() if infos is None else infos,
                                        self.pools)
        except TargetError as exc:
            raise RequestError(str(exc)) from None
        t = request.target
        if t.memory_gib is not None and any(c.provider == LOCAL_PROVIDER for c in resolution.candidates):
            raise RequestError(not_available(
                "options.target.memory_gib on a run this server may run itself",
                "memory budgets for this server's own devices (SPEC M; budgets apply to worker cards)"))
        self.validate_graph(request, resolution)
        budget_source = None
        if t.memory_gib is not None:
            budget_source = t.memory_source or "user"
        return Admission(request, resolution, t.memory_gib, budget_source)

    def submit(self, request: RunRequest) -> dict[str, Any]:
        """Queue a run; raise RequestError (400) for a target or graph this server rejects."""
        return self.enqueue([self.admit(request)])[0]

    def enqueue(self, admissions: Sequence[Admission],
                write_extra: Callable[[list[str]], None] | None = None) -> list[dict[str, Any]]:
        """Write admitted runs in one store transaction, then add them to the queue in one pass.

        ``write_extra(run_ids)`` runs inside the same transaction (a sweep's own rows): if it or any
        insert fails, nothing is written and nothing is queued."""
        if self.shutting_down:
            raise RequestError("the server is stopping; submit again when it is back", status=503)
        with self.store.transaction():
            run_ids = [self.store.create_run(
                graph=a.request.graph,
                options=a.request.options,
                target=a.resolution.target,
                requested=list(a.resolution.requested),
                candidates=[c.to_json() for c in a.resolution.candidates],
                queue_key=a.resolution.queue_key,
                name=a.request.name,
                seed=a.request.seed,
                budget_gib=a.budget_gib,
                budget_source=a.budget_source,
                warnings=list(a.resolution.warnings),
            ) for a in admissions]
            if write_extra is not None:
                write_extra(run_ids)
        for a, run_id in zip(admissions, run_ids, strict=True):
            self._queue.add(QueuedRun(run_id, a.resolution.candidates))
            self._unexplained.add(run_id)
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
        if not self._queue:
            return
        state = self.slot_state()
        result = self._queue.plan(state, admit=self._admit if self.admit_hooks else None, explain=False)
        for placement in result.placements:
            self._place(placement.run_id, placement.provider, placement.devices)
        changed: dict[str, str | None] = {}
        for run_id in list(self._unexplained):  # a new run gets its reason at once
            self._unexplained.discard(run_id)
            run = self._queue.get(run_id)
            if run is not None:
                self._reasons[run_id] = changed[run_id] = result.explain(run)
        # The others are refreshed at most every REASONS_REFRESH_S: placements never wait for texts.
        loop = asyncio.get_running_loop()
        since = loop.time() - self._reasons_at
        if result.blocked and since >= REASONS_REFRESH_S:
            self._reasons_at = loop.time()
            for run_id, reason in result.reasons().items():
                if run_id in self._queue and self._reasons.get(run_id) != reason:
                    self._reasons[run_id] = changed[run_id] = reason
        elif result.blocked and self._reasons_timer is None:
            self._reasons_timer = loop.call_later(REASONS_REFRESH_S - since, self._reasons_due)
        if changed:
            self.store.set_waiting_reasons(changed)

    def _reasons_due(self) -> None:
        self._reasons_timer = None
        self.wake()

    def _place(self, run_id: str, provider_name: str, devices: tuple[str, ...]) -> None:
        provider = self.providers.get(provider_name)
        placement = "local" if getattr(provider, "is_local", False) else "worker"
        run_dir = str(self.home / RUNS_DIR_NAME / run_id) if placement == "local" else None
        self._queue.remove(run_id)
        self._reasons.pop(run_id, None)
        if provider is None or not self.store.assign(run_id, provider=provider_name, placement=placement,
                                                      devices=list(devices), run_dir=run_dir):
            return
        self._holdings[run_id] = (provider_name, tuple(devices))
        self.slot_state().hold(run_id, provider_name, devices)
        self.hub.notify(run_id)
        run = self.store.get_run(run_id, with_graph=True)
        self._spawn(self._start_on(provider, run, list(devices)))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _start_on(self, provider: Any, run: dict[str, Any], devices: list[str]) -> None:
        try:
            await provider.start_run(run, devices)
        except Exception as exc:  # noqa: BLE001 - report it on the run, keep the queue going
            log.exception("run %s: could not start on %s", run["id"], provider.name)
            where = "this server" if getattr(provider, "is_local", False) else f"worker {provider.name}"
            self.run_ended(run["id"], "failed", f"could not start the run on {where}: {type(exc).__name__}: {exc}")

    # --- RunHost: what providers report ----------------------------------------------------------

    def ingest(self, run_id: str, events: Sequence[Mapping[str, Any]]) -> None:
        """Store a run child's events (deduplicated by ``seq``); ``run_finished`` ends the run."""
        batch = []
        for ev in events:
            payload = ev.get("payload")
            ts = ev.get("ts")
            batch.append(NewEvent(
                type=str(ev.get("type")),
                payload=payload if isinstance(payload, Mapping) else {"value": payload},
                ts=float(ts) if isinstance(ts, int | float) else None,
                source_seq=int(ev["seq"]) if isinstance(ev.get("seq"), int) else None,
            ))
        try:
            result = self.store.append_events(run_id, batch)
        except StoreError:
            log.warning("events for unknown run %s dropped", run_id)
            return
        for ev in batch:
            if ev.type == "run_started" and result.stored:  # facts visible while it runs
                p = ev.payload
                facts = {k: p[k] for k in ("pid", "placement") if k in p}
                if "devices" in p:
                    facts["run_devices"] = p["devices"]
                if "device_aliases" in p:
                    facts["device_aliases"] = p["device_aliases"]
                self.store.set_execution_facts(run_id, facts)
        if result.finished is not None:
            self._release(run_id)
        if result.stored:
            self.hub.notify(run_id)

    def run_process_started(self, run_id: str, pid: int | None = None) -> None:
        if self.store.mark_running(run_id, pid=pid):
            self.hub.notify(run_id)

    def run_ended(self, run_id: str, status: str, error: str | None) -> None:
        """The run's process is gone without having reported ``run_finished``."""
        if self.store.finish(run_id, status, error=error):
            self.hub.notify(run_id)
        self._release(run_id)

    def is_finished(self, run_id: str) -> bool:
        run = self.store.get_run(run_id)
        return run is None or run["status"] in TERMINAL_STATUSES

    def _release(self, run_id: str) -> None:
        if self._holdings.pop(run_id, None) is not None:
            if self._state is not None:
                self._state.release(run_id)
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

    def delete(self, run_id: str) -> dict[str, Any]:
        """Delete a finished run (record, events, local run directory)."""
        run = self.store.delete_run(run_id)
        run_dir = run.get("run_dir")
        runs_root = (self.home / RUNS_DIR_NAME).resolve()
        if run_dir:
            path = Path(run_dir).resolve()
            if path.parent == runs_root and path.name == run_id:
                shutil.rmtree(path, ignore_errors=True)
        self.hub.notify(run_id)
        return run

    def queue_length(self) -> int:
        return len(self._queue)

    def queue_position(self, run_id: str) -> int | None:
        """1-based position among queued runs (None when not queued)."""
        return self._queue.position(run_id)

    # --- restart recovery ------------------------------------------------------------------------

    async def _recover(self) -> None:
        """Runs that were assigned or running here when the sidecar died end ``interrupted`` (unless
        their child recorded a result in events.jsonl first). Worker runs keep their slots: the worker
        issue takes them over when the agent reconnects."""
        for run in self.store.active():
            is_local = run["placement"] == "local" or (run["placement"] is None and run["target"] == LOCAL_PROVIDER)
            if not is_local:
                if run["worker_id"]:
                    self._holdings[run["id"]] = (run["worker_id"], tuple(run["devices"]))
                continue
            pid = run.get("pid")
            if pid and _is_runner_of(pid, run):
                # The orphaned child got EOF on stdin and is stopping; keep its slot until it is gone.
                self._holdings[run["id"]] = (LOCAL_PROVIDER, tuple(run["devices"]))
                self._spawn(self._await_orphan(run))
            else:
                self._finish_recovered(run)

    async def _await_orphan(self, run: dict[str, Any]) -> None:
        pid = int(run["pid"])
        if not await _wait_pid(pid, self.stop_grace_s):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 9)
            await _wait_pid(pid, 5.0)
        self._finish_recovered(run)
        self._release(run["id"])

    def _finish_recovered(self, run: dict[str, Any]) -> None:
        run_id = run["id"]
        if run.get("run_dir"):
            self._import_event_log(run_id, Path(run["run_dir"]) / "events.jsonl")
        self.store.finish(
            run_id, "interrupted",
            error="the server stopped while this run was executing (it ended without reporting a result)",
        )
        self.hub.notify(run_id)

    def _import_event_log(self, run_id: str, path: Path) -> None:
        """Events the child wrote after the sidecar died (a run that finished meanwhile keeps its result)."""
        if not path.is_file():
            return
        last = self.store.last_source_seq(run_id)
        batch: list[dict[str, Any]] = []
        with open(path, "rb") as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue  # a torn last line
                if isinstance(ev, dict) and isinstance(ev.get("seq"), int) and ev["seq"] > last:
                    batch.append(ev)
        if batch:
            self.ingest(run_id, batch)


def _is_runner_of(pid: int, run: Mapping[str, Any]) -> bool:
    """True when ``pid`` is alive and is a process of ``run`` (not a reused pid): a run process, cold
    or forked warm, works in its run directory."""
    try:
        import psutil

        cwd = psutil.Process(pid).cwd()
    except Exception:  # noqa: BLE001 - gone, no access, or psutil missing: not ours
        return False
    return bool(run.get("run_dir")) and Path(cwd).resolve() == Path(run["run_dir"]).resolve()


async def _wait_pid(pid: int, timeout: float) -> bool:
    """Wait for an unrelated process to exit (pidfd on Linux: no polling); True when it is gone."""
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)  # type: ignore[attr-defined]
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        done = loop.create_future()
        loop.add_reader(fd, lambda: done.done() or done.set_result(None))
        try:
            await asyncio.wait_for(done, timeout)
            return True
        except asyncio.TimeoutError:
            return False
        finally:
            loop.remove_reader(fd)
            os.close(fd)
    try:
        import psutil

        await asyncio.to_thread(psutil.Process(pid).wait, timeout)
        return True
    except Exception:  # noqa: BLE001 - gone already (NoSuchProcess) or timed out
        try:
            import psutil

            return not psutil.pid_exists(pid)
        except ImportError:
            return True
