"""Studies on the sidecar (docs/sweeps.md): a search driven by Optuna, its trials run as queued runs.

* Create: the spec is parsed; the options every trial shares and the study's probe points (every
  parameter at both ends of its range, every listed value) go through the same ``parse_run_request`` and
  :meth:`Dispatcher.admit` as a run submitted alone, so a target one run would be refused rejects the
  study with that 400 before anything is queued. Then the Optuna study is created (optuna_bridge.py:
  its storage is ``state.db``) and a driver task starts.
* Driver (one asyncio task per study): keeps ``parallel`` trials in flight. Each trial is asked from
  Optuna (in its thread), becomes a run (the run and the trial's row in one transaction), and is watched.
* Watching: the dispatcher's :class:`EventHub` wakes the watcher whenever the run has new events; it
  reads the new ``metric`` events of the pruner's metric from the store as they are ingested, reports
  each to Optuna at its step and, while the run still runs, asks the pruner; a pruned trial is told
  PRUNED at once and its run is stopped (cancel). A run that succeeds with a finite objective value
  completes its trial; anything else fails it (the reason is kept).
* Restart: a study still running when the sidecar stopped is resumed: trials whose runs ended meanwhile
  are told, running ones are watched again, a trial asked but never queued is failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import csv
import importlib.util
import io
import logging
import math
import uuid
from pathlib import Path
from typing import Any

from ...common.errors import ApiError, RequestError, StoreError
from ...common.signals import KeyedSignals, cancel_and_wait, wait_for_change
from ...constants import TERMINAL_STATUSES
from .driver import (
    VERSION_RECHECK_S,
    admit_child,
    check_shared_options,
    describe_values,
    known_inputs_of_nodes,
    spec_error,
)
from .expand import param_labels, probe_points, study_child
from .optuna_bridge import OptunaBridge, reported_value
from .params import KnownInputs, SpecError
from .ranking import better, metric_of
from .records import STUDY_ACTIVE, StudyRecords, last_progress
from .spec import StudySpec, parse_study

log = logging.getLogger("xpufleet.studies")

WATCH_WAKE_S = 30.0  # a watcher re-reads its run at least this often (the hub normally wakes it first)
EVENTS_PAGE = 500


class StudyService:
    """Creates, drives, reads, cancels and deletes studies (one per sidecar; lives on the event loop)."""

    def __init__(self, store: Any, dispatcher: Any, db_path: str | Path,
                 known_inputs: KnownInputs | None = None) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.records = StudyRecords(store)
        self.bridge = OptunaBridge(db_path)
        self.known_inputs = known_inputs or known_inputs_of_nodes()
        self._drivers: dict[str, asyncio.Task[None]] = {}
        self._signals = KeyedSignals()  # by study id: its next change (long-polls)
        self._label_cache: dict[str, dict[str, str]] = {}
        self.closing = False

    def _parse(self, body: Any) -> StudySpec:
        try:
            return parse_study(body, self.known_inputs)
        except SpecError as exc:
            raise spec_error(exc) from None

    # --- lifecycle --------------------------------------------------------------------------------

    async def start(self) -> None:
        """Resume the studies that were running when the sidecar stopped."""
        for rec in self.records.active():
            try:
                spec = self._parse({**rec["spec"], "graph": self.records.graph(rec["id"])})
            except RequestError as exc:  # stored by an older version and no longer valid
                self.records.set_status(rec["id"], "failed", f"could not resume the study: {exc.message}")
                self._changed(rec["id"])
                continue
            self._start(rec["id"], spec, resume=True)

    async def close(self) -> None:
        """Stop the drivers (their studies stay running and resume at the next start) and Optuna."""
        self.closing = True
        await cancel_and_wait(self._drivers.values())
        await self.bridge.close()

    def _start(self, study_id: str, spec: StudySpec, resume: bool) -> None:
        task = asyncio.get_running_loop().create_task(self._drive(study_id, spec, resume),
                                                      name=f"xpufleet-study-{study_id[:8]}")
        self._drivers[study_id] = task
        task.add_done_callback(lambda _t: self._drivers.pop(study_id, None))

    async def wait_idle(self, study_id: str) -> None:
        """Until the study's driver has ended (tests, delete)."""
        task = self._drivers.get(study_id)
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(task)

    # --- create -----------------------------------------------------------------------------------

    async def create(self, body: Any) -> dict[str, Any]:
        """Check the study as a whole, create it in Optuna and start its driver."""
        if importlib.util.find_spec("optuna") is None:  # a control-plane install without the extra
            raise ApiError(400, "studies need Optuna on this server: pip install 'xpufleet[studies]' (sweeps "
                                "and runs work without it)")
        spec = self._parse(body)
        check_shared_options(self.dispatcher, spec.graph, spec.options)
        infos = self.dispatcher.provider_infos()
        for values in probe_points(spec.params):
            admit_child(self.dispatcher, study_child(spec, 0, values), infos,
                        f"the study's runs ({describe_values(values)})", {"parameters": values})
        study_id = uuid.uuid4().hex
        optuna_name = f"xpufleet-{study_id}"
        try:
            await self.bridge.call(self.bridge.open, optuna_name, spec)
        except Exception as exc:  # noqa: BLE001 - a storage problem: say what happened, keep nothing
            log.exception("study %s: Optuna could not create it", study_id)
            with contextlib.suppress(Exception):
                await self.bridge.call(self.bridge.delete, optuna_name)
            raise ApiError(500, f"Optuna could not create the study: {type(exc).__name__}: {exc}") from None
        stored = {k: v for k, v in dict(body).items() if k != "graph"}
        self.records.insert(study_id, spec.name, stored, spec.graph, optuna_name, spec.objective.metric,
                            spec.objective.direction, [p.path for p in spec.params], spec.n_trials)
        self._start(study_id, spec, resume=False)
        log.info("study %s (%s): %d trials, %d at a time", study_id, spec.name, spec.n_trials, spec.parallel)
        return {"study_id": study_id, "name": spec.name, "status": "running", "n_trials": spec.n_trials,
                "parallel": spec.parallel}

    # --- the driver -------------------------------------------------------------------------------

    async def _drive(self, study_id: str, spec: StudySpec, resume: bool) -> None:
        name = self.records.get(study_id)["optuna_name"]
        in_flight: dict[int, asyncio.Task[None]] = {}
        error: str | None = None
        try:
            if resume:
                await self.bridge.call(self.bridge.open, name, spec)
                known = {t["number"]: t for t in self.records.trials(study_id)}
                for number, trial_id in await self.bridge.call(self.bridge.running_trials, name):
                    if number not in known:  # asked, but the sidecar died before its run was queued
                        self.records.insert_trial(study_id, number, trial_id, None, {}, "failed",
                                                  "the sidecar stopped before this trial's run was queued")
                        await self.bridge.call(self.bridge.tell, name, number, trial_id, "failed")
                for t in known.values():
                    if t["state"] == "running" or (t["state"] == "pruned" and t["row"].status in
                                                   ("queued", "assigned", "running")):
                        in_flight[t["number"]] = self._watch_task(study_id, spec, name, t["number"],
                                                                  t["trial_id"], t["run_id"], t["state"])
            asked = len(self.records.trials(study_id))
            while True:
                stopping = error is not None or self.records.get(study_id)["cancel_requested"]
                while not stopping and len(in_flight) < spec.parallel and asked < spec.n_trials:
                    # Asking and queueing are one step a shutdown does not cut in two (else Optuna would
                    # hold a trial the study never ran): the shielded step ends before the cancel lands.
                    step = asyncio.ensure_future(self._next_trial(study_id, spec, name))
                    try:
                        number, trial_id, run_id, error = await asyncio.shield(step)
                    except asyncio.CancelledError:
                        with contextlib.suppress(Exception):
                            await step
                        raise
                    asked += 1
                    if run_id is None:
                        break
                    in_flight[number] = self._watch_task(study_id, spec, name, number, trial_id, run_id)
                if not in_flight:
                    break
                done, _ = await asyncio.wait(in_flight.values(), return_when=asyncio.FIRST_COMPLETED)
                for number, task in list(in_flight.items()):
                    if task in done:
                        del in_flight[number]
                        if not task.cancelled() and task.exception() is not None:
                            log.error("study %s trial %d: watcher failed", study_id, number,
                                      exc_info=task.exception())
            cancelled = self.records.get(study_id)["cancel_requested"]
            status = "cancelled" if cancelled else ("failed" if error else "finished")
            self.records.set_status(study_id, status, error)
            self._changed(study_id)
            log.info("study %s: %s", study_id, status)
        except asyncio.CancelledError:
            for t in in_flight.values():
                t.cancel()
            raise
        except Exception as exc:  # noqa: BLE001 - the study says why it stopped; the sidecar goes on
            log.exception("study %s: the driver failed", study_id)
            for t in in_flight.values():
                t.cancel()
            self.records.set_status(study_id, "failed", f"the study's driver failed: {type(exc).__name__}: {exc}")
            self._changed(study_id)

    async def _next_trial(self, study_id: str, spec: StudySpec, name: str,
                          ) -> tuple[int, int, str | None, str | None]:
        """Ask Optuna for a trial and queue its run: (number, trial id, run id or None, error or None)."""
        number, trial_id, values = await self.bridge.call(self.bridge.ask, name, spec)
        if self.records.get(study_id)["cancel_requested"]:
            self.records.insert_trial(study_id, number, trial_id, None, values, "failed",
                                      "the study was cancelled before this trial was queued")
            self._changed(study_id)
            await self.bridge.call(self.bridge.tell, name, number, trial_id, "failed")
            return number, trial_id, None, None
        run_id, error = self._queue_trial(study_id, spec, number, trial_id, values)
        if run_id is None:
            await self.bridge.call(self.bridge.tell, name, number, trial_id, "failed")
        return number, trial_id, run_id, error

    def _queue_trial(self, study_id: str, spec: StudySpec, number: int, trial_id: int,
                     values: dict[str, Any]) -> tuple[str | None, str | None]:
        """Queue one trial's run (its row in the same transaction); (run id, None) or (None, error)."""
        try:
            admission = admit_child(self.dispatcher, study_child(spec, number, values), None,
                                    f"trial {number} ({describe_values(values)})", {})
            queued = self.dispatcher.enqueue([admission], write_extra=lambda ids: self.records.insert_trial(
                study_id, number, trial_id, ids[0], values))
        except RequestError as exc:
            self.records.insert_trial(study_id, number, trial_id, None, values, "failed", exc.message)
            self._changed(study_id)
            return None, f"trial {number} could not be queued: {exc.message}"
        self._changed(study_id)
        return queued[0]["run_id"], None

    def _watch_task(self, study_id: str, spec: StudySpec, name: str, number: int, trial_id: int, run_id: str,
                    state: str = "running") -> asyncio.Task[None]:
        return asyncio.get_running_loop().create_task(
            self._watch(study_id, spec, name, number, trial_id, run_id, state == "pruned"))

    async def _watch(self, study_id: str, spec: StudySpec, name: str, number: int, trial_id: int, run_id: str,
                     pruned: bool) -> None:
        """Report the run's pruning metric as it trains, prune it, and tell Optuna how it ended."""
        hub = self.dispatcher.hub
        pruning = spec.pruner.kind != "none" and spec.pruner.metric is not None
        reported: set[int] = set()
        if pruning and not pruned:
            reported = set(await self.bridge.call(self.bridge.reported_steps, name, trial_id))
        cursor = 0
        next_step = 0
        while True:
            waiter = hub.waiter(run_id)  # before reading: a notification in between is not lost
            run = self.store.get_run(run_id)
            active = run is not None and run["status"] not in TERMINAL_STATUSES
            while pruning and not pruned:
                events = self.store.events_after(run_id, cursor, EVENTS_PAGE, types=["metric"])
                for ev in events:
                    cursor = ev["cursor"]
                    p = ev["payload"]
                    value = p.get("value")
                    if p.get("name") != spec.pruner.metric or not isinstance(value, int | float) \
                            or isinstance(value, bool) or not math.isfinite(value):
                        continue
                    step = p.get("step") if isinstance(p.get("step"), int) and p["step"] >= 0 else next_step
                    next_step = step + 1
                    if step in reported:
                        continue
                    reported.add(step)
                    live = self._running(run_id)  # now, not when the page was read: a backlog may be late
                    stop = await self.bridge.call(self.bridge.report, name, number, trial_id,
                                                  reported_value(spec, float(value)), step, live)
                    if stop and await self._stop_pruned(spec, run_id, step, float(value)):
                        pruned = True
                        self.records.mark_pruned(study_id, number, step)
                        self._changed(study_id)
                        await self.bridge.call(self.bridge.tell, name, number, trial_id, "pruned")
                        log.info("study %s trial %d: pruned at step %d (%s %g)", study_id, number, step,
                                 spec.pruner.metric, value)
                        break
                if len(events) < EVENTS_PAGE or pruned:
                    break
                await asyncio.sleep(0)  # a long backlog of metrics: the loop goes round between pages
            if not active:
                break
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(waiter.wait(), WATCH_WAKE_S)
        if pruned:
            return
        status = run["status"] if run is not None else "deleted"
        value = metric_of(run.get("final_metrics"), spec.objective.metric) if status == "succeeded" else None
        if value is not None:
            await self.bridge.call(self.bridge.tell, name, number, trial_id, "complete", value)
            self.records.finish_trial(study_id, number, "complete", value, None)
            self._changed(study_id)
            return
        if status == "succeeded":
            reason = f"the run succeeded but reported no finite {spec.objective.metric}"
        elif status == "cancelled":  # why it was cancelled (the study, a user): the cancel's own reason
            asked = self.store.events_after(run_id, 0, 100, types=["cancel_requested"])
            why = next((e["payload"].get("reason") for e in reversed(asked) if e["payload"].get("reason")), None)
            why = why or (run.get("error") or "by request").removeprefix("cancelled: ")
            reason = f"the run was cancelled: {why}"
        else:
            reason = f"the run ended {status}" + (f": {run['error']}" if run is not None and run.get("error") else "")
        await self.bridge.call(self.bridge.tell, name, number, trial_id, "failed")
        self.records.finish_trial(study_id, number, "failed", None, reason)
        self._changed(study_id)

    def _running(self, run_id: str) -> bool:
        run = self.store.get_run(run_id)
        return run is not None and run["status"] not in TERMINAL_STATUSES

    async def _stop_pruned(self, spec: StudySpec, run_id: str, step: int, value: float) -> bool:
        """Stop the run the pruner just pruned; False when it had ended first (then its end is told)."""
        try:
            await self.dispatcher.cancel(run_id, f"pruned by study {spec.name} at step {step} "
                                                 f"({spec.pruner.metric} {value:g})")
        except StoreError:
            return False
        return True

    # --- read -------------------------------------------------------------------------------------

    def require(self, study_id: str) -> dict[str, Any]:
        rec = self.records.get(study_id)
        if rec is None:
            raise ApiError(404, f"no study {study_id!r}")
        return rec

    @staticmethod
    def _trial_json(t: dict[str, Any]) -> dict[str, Any]:
        r = t["row"]
        return {"number": t["number"], "state": t["state"], "value": t["value"], "parameters": r.values,
                "run_id": r.run_id, "run_status": r.status, "name": r.name, "worker_id": r.worker_id,
                "devices": r.devices, "queue_key": r.queue_key, "pruned_step": t["pruned_step"],
                "reason": t["reason"], "created_at": t["created_at"], "started_at": r.started_at,
                "finished_at": t["finished_at"]}

    def get(self, study_id: str) -> dict[str, Any]:
        """The study: status, every trial (state, value, parameters, run, worker_id, devices, queue_key),
        counts by state and the best trial."""
        rec = self.require(study_id)
        trials = [self._trial_json(t) for t in self.records.trials(study_id)]
        progress = last_progress(self.store, [t["run_id"] for t in trials if t["run_status"] == "running" and t["run_id"]])
        for t in trials:
            t["progress"] = progress.get(t["run_id"] or "")
        top = None
        for t in trials:
            if t["state"] == "complete" and t["value"] is not None and (
                    top is None or better(t["value"], top["value"], rec["direction"])):
                top = t
        counts: dict[str, int] = {}
        for t in trials:
            counts[t["state"]] = counts.get(t["state"], 0) + 1
        spec = rec["spec"]
        return {"id": rec["id"], "name": rec["name"], "status": rec["status"], "error": rec["error"],
                "objective": {"metric": rec["metric"], "direction": rec["direction"]},
                "parameters": rec["paths"], "labels": self._labels(study_id, rec["paths"]),
                "n_trials": rec["n_trials"], "parallel": spec.get("parallel", 1),
                "pruner": spec.get("pruner"), "sampler": spec.get("sampler"), "spec": spec,
                "cancel_requested": rec["cancel_requested"], "created_at": rec["created_at"],
                "finished_at": rec["finished_at"], "counts": counts, "best_trial": top, "trials": trials,
                "version": self.records.version(study_id)}

    def _labels(self, study_id: str, paths: list[str]) -> dict[str, str]:
        """The parameters' names by node title (a study's graph never changes: worked out once)."""
        if study_id not in self._label_cache:
            self._label_cache[study_id] = param_labels(self.records.graph(study_id), paths)
        return self._label_cache[study_id]

    def csv(self, study_id: str) -> str:
        rec = self.require(study_id)
        paths = rec["paths"]
        buf = io.StringIO()
        w = csv.writer(buf, lineterminator="\n")
        w.writerow(["number", "state", rec["metric"], *paths, "run_id", "run_status", "worker_id", "devices",
                    "queue_key", "pruned_step", "reason"])
        for t in map(self._trial_json, self.records.trials(study_id)):
            w.writerow([t["number"], t["state"], "" if t["value"] is None else repr(t["value"]),
                        *["" if t["parameters"].get(p) is None else t["parameters"][p] for p in paths],
                        t["run_id"] or "", t["run_status"], t["worker_id"] or "", ",".join(t["devices"]),
                        t["queue_key"] or "", "" if t["pruned_step"] is None else t["pruned_step"], t["reason"] or ""])
        return buf.getvalue()

    def list(self, limit: int, offset: int) -> dict[str, Any]:
        studies, total = self.records.list(limit, offset)
        return {"studies": [{k: s[k] for k in ("id", "name", "status", "error", "n_trials", "created_at",
                                               "finished_at", "counts")}
                            | {"objective": {"metric": s["metric"], "direction": s["direction"]},
                               "parameters": s["paths"]} for s in studies], "total": total}

    def _changed(self, study_id: str) -> None:
        self._signals.notify(study_id)

    async def wait_change(self, study_id: str, version: int, timeout: float) -> None:
        """Return when the study's version differs from ``version`` (a trial asked, pruned or told, a
        trial's run moved on, the study ended) or after ``timeout`` seconds."""
        self.require(study_id)

        def signals() -> list[asyncio.Event]:
            active = [t["run_id"] for t in self.records.trials(study_id)
                      if t["run_id"] and t["row"].status in ("queued", "assigned", "running")]
            return [self._signals.waiter(study_id), *(self.dispatcher.hub.waiter(rid) for rid in active)]

        def done() -> bool:
            rec = self.records.get(study_id)
            return self.records.version(study_id) != version or rec is None or rec["status"] not in STUDY_ACTIVE

        await wait_for_change(done, signals, timeout, VERSION_RECHECK_S)

    # --- cancel / delete --------------------------------------------------------------------------

    async def cancel(self, study_id: str, reason: str | None = None) -> dict[str, Any]:
        """No new trial is asked; every trial's run still queued or running is cancelled (its trial fails)."""
        rec = self.require(study_id)
        if rec["status"] not in STUDY_ACTIVE:
            raise ApiError(409, f"study {study_id} already ended ({rec['status']}); nothing to cancel")
        self.records.request_cancel(study_id)
        self._changed(study_id)
        why = f"study {rec['name']} cancelled" + (f": {reason}" if reason else "")
        trials = self.records.trials(study_id)
        order = [t for t in trials if t["row"].status == "queued"] + \
                [t for t in trials if t["row"].status in ("assigned", "running")]
        for t in order:
            with contextlib.suppress(StoreError):
                await self.dispatcher.cancel(t["run_id"], why)
        if study_id not in self._drivers:
            self.records.set_status(study_id, "cancelled")
            self._changed(study_id)
        return self.get(study_id)

    async def delete(self, study_id: str) -> dict[str, Any]:
        """Delete an ended study: its rows, its Optuna study and its trials' runs."""
        rec = self.require(study_id)
        if rec["status"] in STUDY_ACTIVE:
            raise ApiError(409, f"study {study_id} is {rec['status']}: cancel it first "
                                f"(POST /api/studies/{study_id}/cancel)")
        deleted = 0
        for t in self.records.trials(study_id):
            if t["run_id"] and t["row"].status not in ("deleted", "not queued"):
                with contextlib.suppress(StoreError):
                    self.dispatcher.delete(t["run_id"])
                    deleted += 1
        await self.bridge.call(self.bridge.delete, rec["optuna_name"])
        self.records.delete(study_id)
        return {"deleted": study_id, "runs_deleted": deleted}
