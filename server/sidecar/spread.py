"""The sidecar's side of ddp across workers (docs/architecture.md "ddp across workers").

A run with ``options.target.spread`` is admitted only when it trains with ddp. Its cards are one
candidate over every part's cards, decided like a device set's: on exclusive cards the slot rule
places it on every part's cards at once (server/scheduling/plan.py); on cards shared by memory the
memory ledger checks its budget on every card of every part at submit and starts it only when it fits
on all of them at once (server/memory/); cards of both kinds are refused, as for a device set. It then
is rank 0's worker's run: the store records that worker and its cards; the other parts' cards are held
under ``<run id>@<worker>`` until the run ends (the ledger counts the budget on every card under the
run id), and every part gets the same budget cap.

* Start: rank 0's worker gets ``start_run`` with the layout. When rank 0 reports ``ddp_ready`` with
  its store's ``host:port``, every other part's worker gets ``start_part``.
* A failure: a part whose rank failed by itself (``part_finished`` with ``failed_rank``), or whose
  worker disconnected, is the run's root cause, ``DDP rank 1 of 2 failed on worker b: ...``; the
  other workers' ranks are told to stop (``cancel_run`` to rank 0's worker, ``stop_part`` to the
  others). A spread run does not wait out the resume grace for a part's worker: its collectives
  cannot go on without those ranks.
* The end: rank 0's ``run_finished`` is held until every part has reported (or
  ``SPREAD_PARTS_WAIT_S`` passed), so the run ends once no rank runs on any worker, and its error is
  the root cause when rank 0 only lost its peers or was stopped for it. If rank 0's worker is gone
  when a part reports that its ranks lost their peers, the run fails naming rank 0 and that worker.
* A sidecar restart ends a spread run that was assigned or running ``interrupted`` (its parts are
  not persisted); the agents then stop its ranks.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ...common.errors import RequestError
from ...constants import SPREAD_PARTS_WAIT_S
from ..run import ddp
from ..run.spread import Layout, failure_text, layout_of
from .providers import RunHost
from .slots import SlotBook

if TYPE_CHECKING:
    from ..run.requests import RunRequest
    from ..scheduling import Resolution

log = logging.getLogger("xpufleet.dispatcher")


@dataclass
class SpreadRun:
    """One placed spread run: its layout, which parts have ended, and its root cause once known."""

    run_id: str
    layout: Layout  # seen from part 0
    started: bool = False  # start_part sent to the other parts
    done: dict[int, dict[str, Any]] = field(default_factory=dict)  # part index -> part_finished
    cause: str | None = None
    cause_rank: int | None = None
    cause_worker: str | None = None
    stopped: bool = False  # the sidecar stopped rank 0 for a part's failure
    held: list[Any] | None = None  # rank 0's run_finished, waiting for the parts
    timer: asyncio.TimerHandle | None = None
    ended: bool = False
    budget_gib: float | None = None  # per card, on every part (the memory ledger's; None: no cap)

    def pending(self) -> list[int]:
        """Parts (1..) that were started and have not reported."""
        return [i for i in range(1, len(self.layout.parts)) if self.started and i not in self.done]


def holder_id(run_id: str, worker: str) -> str:
    """The slot holder of a spread run's part on ``worker`` (the run id holds part 0)."""
    return f"{run_id}@{worker}"


class SpreadRuns:
    """The spread runs of one dispatcher (see the module docstring).

    ``store``: the runs' records; ``slots``: where the other parts hold their cards (and the providers to
    send to); ``events``: the run-events interface rank 0's held end and a part's failure go through;
    ``spawn``: background tasks."""

    def __init__(self, store: Any, slots: SlotBook, events: RunHost,
                 spawn: Callable[[Coroutine[Any, Any, Any]], None]) -> None:
        self._store = store
        self._slots = slots
        self._events = events
        self._spawn = spawn
        self.runs: dict[str, SpreadRun] = {}

    # --- admission --------------------------------------------------------------------------------

    def check(self, request: RunRequest, resolution: Resolution) -> None:
        """The 400s of a spread run that the target alone does not tell: a graph that does not train
        with ddp (or trains two ddp loops side by side). Its cards' memory is decided like a device set's
        (server/memory/submit.py), on every part's cards."""
        if request.target.spread is None:
            return
        if not ddp.ddp_loops(request.graph):
            raise RequestError("options.target.spread: a run spread over workers trains with ddp, one rank per "
                               "card; this graph has no TrainingLoop with strategy ddp (set strategy to ddp, or "
                               "target one worker)")
        parallel = ddp.parallel_loops_error(request.graph)
        if parallel is not None:
            raise RequestError("options.target.spread: " + parallel.errors[0].message)

    # --- placement ------------------------------------------------------------------------------------

    def placed(self, run_id: str, provider: str, devices: tuple[str, ...],
               extra: tuple[tuple[str, tuple[str, ...]], ...], budget_gib: float | None = None) -> dict[str, Any]:
        """Hold the other parts' cards and remember the run (``budget_gib``: the cap rank 0 gets, which
        every part gets too); the layout ``start_run`` carries."""
        layout = layout_of(((provider, devices), *extra), 0)
        self.runs[run_id] = SpreadRun(run_id, layout, budget_gib=budget_gib)
        for worker, devs in extra:
            self._slots.hold(holder_id(run_id, worker), worker, devs)
        self._store.set_execution_facts(run_id, {"spread": layout.to_json()["parts"],
                                                  "world_size": layout.world_size})
        return layout.to_json()

    def part_holdings(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """The other parts' slot holdings (the workers panel counts them)."""
        return {hid: h for hid, h in self._slots.holdings.items() if "@" in hid}

    def release(self, run_id: str) -> None:
        run = self.runs.get(run_id)
        if run is None:
            return
        for part in run.layout.parts[1:]:
            self._slots.release(holder_id(run_id, part.worker))
        if run.timer is not None:
            run.timer.cancel()
        self.runs.pop(run_id, None)
        self._stop_parts(run, "the run ended")

    # --- events of rank 0 -------------------------------------------------------------------------------

    def filter(self, run_id: str, events: list[Any]) -> list[Any]:
        """Rank 0's events as the run keeps them: ``ddp_ready`` starts the other parts; ``run_finished``
        waits for them and names the root cause."""
        run = self.runs.get(run_id)
        if run is None or run.ended:
            return events
        out = []
        for ev in events:
            kind = ev.get("type")
            if kind == "ddp_ready" and not run.started:
                store = (ev.get("payload") or {}).get("store")
                if store:
                    run.started = True
                    self._spawn(self._start_parts(run, store))
            if kind == "run_finished":
                run.held = [*(run.held or []), ev]
                if run.pending():
                    self._stop_parts(run, "rank 0 ended")
                    run.timer = asyncio.get_running_loop().call_later(SPREAD_PARTS_WAIT_S, self._finish, run_id)
                    continue
                out.append(self._final(run, ev))
                run.ended = True
                continue
            out.append(ev)
        return out

    def _finish(self, run_id: str) -> None:
        """Every part has reported (or the wait ran out): the held ``run_finished`` goes in."""
        run = self.runs.get(run_id)
        if run is None or run.ended or not run.held:
            return
        run.ended = True
        if run.timer is not None:
            run.timer.cancel()
        self._events.ingest(run_id, [self._final(run, ev) for ev in run.held])

    def _final(self, run: SpreadRun, ev: Any) -> Any:
        payload = dict(ev.get("payload") or {})
        peer_lost = bool(payload.pop("ddp_peer_lost", False))
        facts = dict(payload.get("execution_facts") or {})
        facts["spread_parts"] = [{"worker": p.worker, "ranks": [p.first_rank, p.first_rank + len(p.devices) - 1],
                                  **({"status": run.done[i].get("status")} if i in run.done else {})}
                                 for i, p in enumerate(run.layout.parts)]
        if run.cause is not None and payload.get("status") != "succeeded" and (peer_lost or run.stopped):
            if payload.get("error"):
                facts["ddp_rank0_error"] = payload["error"]
            payload.update(status="failed", error=run.cause)
            facts.update(ddp_failed_rank=run.cause_rank, ddp_failed_worker=run.cause_worker)
        payload["execution_facts"] = facts
        return {**ev, "payload": payload}

    # --- the other parts ----------------------------------------------------------------------------

    def _provider(self, worker: str) -> Any:
        return self._slots.providers.get(worker)

    async def _send(self, worker: str, mtype: str, **fields: Any) -> bool:
        provider = self._provider(worker)
        send = getattr(provider, "send", None)
        if send is None or not provider.online:
            return False
        try:
            return bool(await send(mtype, **fields))
        except Exception:  # noqa: BLE001 - a worker gone meanwhile: treated as its part failing
            log.exception("run: sending %s to worker %s failed", mtype, worker)
            return False

    async def _start_parts(self, run: SpreadRun, store: str) -> None:
        record = self._store.get_run(run.run_id, with_graph=True)
        if record is None:
            return
        for i, part in enumerate(run.layout.parts[1:], start=1):
            unreachable = self._unreachable(run, part.worker, store)
            if unreachable is not None:
                self._part_done(run, i, {"status": "failed", "failed_rank": part.first_rank, "error": failure_text(
                    part.first_rank, run.layout.world_size, part.worker, unreachable)})
                return
            layout = Layout(run.layout.parts, i, store)
            log.info("run %s: rank 0 opened its store at %s; starting ranks %d.. on worker %s", run.run_id, store,
                     part.first_rank, part.worker)
            ok = await self._send(part.worker, "start_part", run_id=run.run_id, graph=record["graph"],
                                  options=record.get("options") or {}, devices=list(part.devices),
                                  budget_gib=run.budget_gib, spread=layout.to_json())
            if not ok:
                self._part_done(run, i, {"status": "failed", "failed_rank": part.first_rank, "error": failure_text(
                    part.first_rank, run.layout.world_size, part.worker,
                    f"worker {part.worker} is not connected, so its ranks could not start")})

    def _unreachable(self, run: SpreadRun, worker: str, store: str) -> str | None:
        """Why ``worker`` cannot reach rank 0's store: a loopback address advertised by rank 0's worker
        while ``worker`` connects from another machine (its ranks would wait out the collective timeout)."""
        host = store.rpartition(":")[0].strip("[]")
        if not (host.startswith("127.") or host == "::1"):
            return None
        first = run.layout.parts[0].worker
        here, there = getattr(self._provider(first), "peer", None), getattr(self._provider(worker), "peer", None)
        if here is None or there is None or here == there:
            return None
        return (f"rank 0's store is at {store} on worker {first}, a loopback address that worker {worker} (connected "
                f"from {there}, another machine than {first}'s {here}) cannot reach; start {first}'s agent with "
                f"--advertise-addr and an address the other workers reach")

    def _stop_parts(self, run: SpreadRun, why: str) -> None:
        for i in run.pending():
            self._spawn(self._send(run.layout.parts[i].worker, "stop_part", run_id=run.run_id, reason=why))

    def _part_done(self, run: SpreadRun, part: int, outcome: dict[str, Any]) -> None:
        if part in run.done:
            return
        run.done[part] = outcome
        failed_rank = outcome.get("failed_rank")
        if outcome.get("status") == "failed" and run.cause is None and not run.ended:
            if failed_rank is not None:
                run.cause, run.cause_rank = str(outcome.get("error")), int(failed_rank)
                run.cause_worker = run.layout.worker_of(int(failed_rank))
                log.warning("run %s: %s; stopping the other ranks", run.run_id, run.cause)
                self._stop_all(run)
            elif not self._online(run.layout.parts[0].worker) and run.held is None:
                self._rank0_gone(run)  # this part's ranks lost rank 0, whose worker is gone: nobody else reports
                return
        if run.held is not None and not run.pending():
            self._finish(run.run_id)

    def _rank0_gone(self, run: SpreadRun) -> None:
        """Rank 0's worker disconnected and another part's ranks lost it: the run fails, naming rank 0."""
        first = run.layout.parts[0].worker
        run.cause, run.cause_rank, run.cause_worker = failure_text(
            0, run.layout.world_size, first, f"worker {first} disconnected (its agent stopped or lost its "
            f"connection)"), 0, first
        self._stop_parts(run, "rank 0's worker is gone")
        run.ended = True
        self._events.run_ended(run.run_id, "failed", run.cause)

    def _stop_all(self, run: SpreadRun) -> None:
        run.stopped = True
        if run.held is None:
            self._spawn(self._send(run.layout.parts[0].worker, "cancel_run", run_id=run.run_id,
                                     reason=f"stopped: {run.cause}"))
        self._stop_parts(run, str(run.cause))

    def _online(self, worker: str) -> bool:
        provider = self._provider(worker)
        return provider is not None and bool(provider.online)

    async def on_part_finished(self, worker: str, msg: dict[str, Any]) -> None:
        """``part_finished`` from an agent (a registry message handler)."""
        run = self.runs.get(msg["run_id"])
        part = int(msg["part"])
        if run is None or not 0 < part < len(run.layout.parts) or run.layout.parts[part].worker != worker:
            return
        self._part_done(run, part, {k: msg.get(k) for k in ("status", "error", "failed_rank", "peer_lost")})

    def on_connection(self, worker: str, online: bool) -> None:
        """A worker disconnected: its parts of spread runs have failed (a registry connection listener)."""
        if online:
            return
        for run in list(self.runs.values()):
            # Rank 0's worker left after another part already reported losing its peer (the part's report
            # can beat the sidecar's notice of the disconnect): the same conclusion as in _part_done.
            if (run.layout.parts[0].worker == worker and run.started and not run.ended and run.cause is None
                    and run.held is None and any(o.get("status") == "failed" for o in run.done.values())):
                self._rank0_gone(run)
                continue
            for i, part in enumerate(run.layout.parts[1:], start=1):
                if part.worker == worker and run.started and i not in run.done:
                    self._part_done(run, i, {"status": "failed", "failed_rank": part.first_rank, "error": failure_text(
                        part.first_rank, run.layout.world_size, worker,
                        f"worker {worker} disconnected (its agent stopped or lost its connection)")})

    # --- restart ----------------------------------------------------------------------------------------

    def recover(self) -> None:
        """After a sidecar restart: spread runs still assigned or running end interrupted."""
        for run in self._store.active():
            if (run.get("execution_facts") or {}).get("spread"):
                with contextlib.suppress(Exception):
                    self._events.run_ended(run["id"], "interrupted", "the server restarted during this run spread over "
                                     "workers; its ranks on the other workers are not taken over")
