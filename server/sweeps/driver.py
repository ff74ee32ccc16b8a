"""Sweeps on the sidecar (docs/sweeps.md): the whole-batch check, the children queued in one transaction, the
ranked table, cancel and delete.

Every child is a ``POST /api/runs`` body (:func:`.expand.sweep_child`) validated by the same
``parse_run_request`` and checked by the same :meth:`Dispatcher.admit` as a run submitted alone, all of
them before anything is written: one child the server would reject rejects the whole sweep with its
400 (naming the variant) and nothing is queued. Then :meth:`Dispatcher.enqueue` creates every child run
and the sweep's own rows in one store transaction and adds the runs to the queue in one pass.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ...common.errors import ApiError, RequestError, StoreError
from ...common.signals import wait_for_change
from ...constants import SWEEP_ADMIT_BATCH
from ..memory.graph_facts import GraphFacts, graph_facts
from ..run.requests import RunRequest, parse_run_request
from ..scheduling import TargetError
from .expand import Variant, format_value, param_labels, shared_outputs, sweep_child, variants
from .params import KnownInputs, SpecError
from .ranking import Row, best, counts, point_summary, ranked, sweep_status, table_csv
from .records import SweepRecords, last_progress
from .spec import SweepSpec, parse_sweep

log = logging.getLogger("xpufleet.sweeps")

DRY_RUN_SHOWN = 100  # variants a dry run lists (it counts them all)
VERSION_RECHECK_S = 0.25  # a long-poll woken by a child's progress looks at the version at most this often


def known_inputs_of_nodes() -> KnownInputs:
    """class_type -> the inputs the node class declares, from this server's node classes (imported only
    when a parameter names an input the graph leaves out)."""
    cache: dict[str, set[str] | None] = {}

    def lookup(class_type: str) -> set[str] | None:
        if class_type not in cache:
            from ..run.executor import default_node_classes

            cls = default_node_classes().get(class_type)
            if cls is None:
                cache[class_type] = None
            else:
                spec = cls.INPUT_TYPES()
                cache[class_type] = set(spec.get("required", {}) or {}) | set(spec.get("optional", {}) or {})
        return cache[class_type]

    return lookup


def describe_values(values: Mapping[str, Any], seed: int | None = None) -> str:
    text = ", ".join(f"{k}={format_value(v)}" for k, v in values.items())
    if seed is not None:
        text += (", " if text else "") + f"seed {seed}"
    return text


def admit_child(dispatcher: Any, body: dict[str, Any] | RunRequest | RequestError, infos: Any, what: str,
                extra: Mapping[str, Any], facts: GraphFacts | None = None) -> Any:
    """One child through the same path as ``POST /api/runs``: parse, then the dispatcher's admission
    check. A rejection is re-raised with ``what`` (e.g. ``variant 3 (5.lr=0.5)``) in front, the same
    status and the run's own details, plus ``extra``; nothing is written. ``body`` may come parsed (or
    refused) beforehand, with its graph ``facts``, by :meth:`SweepService.draft` in a worker thread."""
    try:
        if isinstance(body, RequestError):
            raise body
        request = body if isinstance(body, RunRequest) else parse_run_request(body)
        return dispatcher.admit(request, infos, facts=facts)
    except RequestError as exc:
        raise RequestError(f"{what}: {exc.message}; nothing was queued", {**exc.extra, **extra},
                           status=exc.status) from None


def shared_request(graph: dict[str, Any], options: dict[str, Any]) -> RunRequest | RequestError | None:
    """The options every child shares, parsed once with the base graph: the request, the refusal of its
    options, or None when only the base graph is refused (it may be invalid where every variant is not:
    each child is checked)."""
    try:
        return parse_run_request({"graph": graph, "options": options})
    except RequestError as exc:
        return None if exc.message.startswith("graph") else exc


def resolve_shared(dispatcher: Any, shared: RunRequest | RequestError | None) -> None:
    """One message about ``options.target`` for the whole sweep, not one per child."""
    if isinstance(shared, RequestError):
        raise shared
    if shared is None:
        return
    try:
        dispatcher.resolve(shared.target)
    except TargetError as exc:
        raise RequestError(f"{exc}; nothing was queued") from None


def check_shared_options(dispatcher: Any, graph: dict[str, Any], options: dict[str, Any]) -> None:
    """The options every child shares, once (see :func:`shared_request` and :func:`resolve_shared`)."""
    resolve_shared(dispatcher, shared_request(graph, options))


@dataclass
class Draft:
    """What :meth:`SweepService.draft` works out in a worker thread: the spec (or why not), the shared
    options, and every child's parsed request (or its refusal) with its graph's validation and key."""

    error: RequestError | None = None  # the spec's refusal (before the shared options are looked at)
    spec: SweepSpec | None = None
    shared: RunRequest | RequestError | None = None
    expand_error: RequestError | None = None  # the expansion's refusal (after them)
    children: list[Variant] = field(default_factory=list)
    requests: list[RunRequest | RequestError] = field(default_factory=list)
    facts: list[GraphFacts | None] = field(default_factory=list)


def dry_run_answer(spec: SweepSpec, children: list[Variant], admissions: list[Any]) -> dict[str, Any]:
    """What a dry run answers: the count and the first ``DRY_RUN_SHOWN`` variants with their queue."""
    explicit = [*spec.fixed, *(p.path for p in spec.params)]
    return {"dry_run": True, "name": spec.name, "n_runs": len(children),
            # the savers moved to each variant's run folder (the dialog says so)
            "own_outputs": shared_outputs(spec.graph, explicit),
            "variants": [{"variant": v.index, "point": v.point, "parameters": v.values, "seed": v.seed,
                          "queue_key": a.resolution.queue_key}
                         for v, a in zip(children[:DRY_RUN_SHOWN], admissions, strict=False)]}


def spec_error(exc: SpecError) -> RequestError:
    return RequestError(str(exc))


class SweepService:
    """Creates, reads, cancels and deletes sweeps (one per sidecar; lives on the event loop)."""

    def __init__(self, store: Any, dispatcher: Any, known_inputs: KnownInputs | None = None) -> None:
        self.store = store
        self.dispatcher = dispatcher
        self.records = SweepRecords(store)
        self.known_inputs = known_inputs or known_inputs_of_nodes()
        self._label_cache: dict[str, dict[str, str]] = {}

    # --- create ---------------------------------------------------------------------------------------

    def draft(self, body: Any) -> Draft:
        """Parse and expand the sweep, and parse, validate and key every child (issue 19: in a worker
        thread; on the event loop a 4-variant sweep of a 1,000-node graph stalled it for a minute). Pure:
        reads no dispatcher state; :meth:`plan` raises what it found, in the order a check on the spot would."""
        try:
            spec = parse_sweep(body, self.known_inputs)
        except SpecError as exc:
            return Draft(error=spec_error(exc))
        out = Draft(spec=spec, shared=shared_request(spec.graph, spec.options))
        try:
            out.children = variants(spec)
        except SpecError as exc:
            out.expand_error = spec_error(exc)
            return out
        for v in out.children:
            try:
                request = parse_run_request(sweep_child(spec, v))
            except RequestError as exc:
                out.requests.append(exc)  # plan() stops at this child at the latest: none after it is needed
                out.facts.append(None)
                break
            out.requests.append(request)
            out.facts.append(graph_facts(request.graph, validate=True))
        return out

    def plan(self, body: Any, draft: Draft | None = None) -> tuple[SweepSpec, list[Variant], list[Any]]:
        """Parse, expand and admit every child (nothing written); RequestError names what to fix.
        ``draft``: :meth:`draft`'s answer, computed in a worker thread (without it, it is computed here);
        only the admission decisions (targets, budgets, the memory ledger) are left to do."""
        spec, children, admitting = self._admitting(body, draft)
        return spec, children, list(admitting)

    def _admitting(self, body: Any, draft: Draft | None) -> tuple[SweepSpec, list[Variant], Iterator[Any]]:
        d = self.draft(body) if draft is None else draft
        if d.error is not None:
            raise d.error
        assert d.spec is not None
        resolve_shared(self.dispatcher, d.shared)
        if d.expand_error is not None:
            raise d.expand_error
        infos = self.dispatcher.provider_infos()  # one snapshot for the whole batch
        admitting = (
            admit_child(self.dispatcher, request, infos,
                        f"variant {v.index} ({describe_values(v.values, v.seed) or 'the base graph'})",
                        {"variant": v.index, "parameters": v.values, "seed": v.seed}, facts=facts)
            for v, request, facts in zip(d.children, d.requests, d.facts, strict=False))
        return d.spec, d.children, admitting

    def create(self, body: Any, dry_run: bool = False, draft: Draft | None = None) -> dict[str, Any]:
        """Queue every child of the sweep, or none (``dry_run``: check and expand only). ``draft``: see
        :meth:`plan`."""
        spec, children, admissions = self.plan(body, draft)
        if dry_run:
            return dry_run_answer(spec, children, admissions)
        sweep_id, write = self._writer(body, spec, children)
        return self._created(sweep_id, spec, self.dispatcher.enqueue(admissions, write_extra=write))

    async def create_off_loop(self, body: Any, dry_run: bool, draft: Draft) -> dict[str, Any]:
        """:meth:`create` for the route: ``draft`` computed in a worker thread, the admissions on the loop
        yielding to it every ``SWEEP_ADMIT_BATCH`` children, the write in a worker thread (issue 19)."""
        spec, children, admitting = self._admitting(body, draft)
        admissions = []
        for a in admitting:
            admissions.append(a)
            if len(admissions) % SWEEP_ADMIT_BATCH == 0:
                await asyncio.sleep(0)  # each child is checked as if submitted alone now: others may go between
        if dry_run:
            return dry_run_answer(spec, children, admissions)
        sweep_id, write = self._writer(body, spec, children)
        return self._created(sweep_id, spec, await self.dispatcher.enqueue_off_loop(admissions, write_extra=write))

    def _writer(self, body: Any, spec: SweepSpec, children: list[Variant]) -> tuple[str, Any]:
        """A new sweep's id and the writer of its own rows (inside the children's transaction)."""
        sweep_id = uuid.uuid4().hex
        stored = {k: v for k, v in dict(body).items() if k != "graph"}
        paths = [p.path for p in spec.params]

        def write(run_ids: list[str]) -> None:
            self.records.insert(sweep_id, spec.name, stored, spec.graph, spec.objective.metric,
                                spec.objective.direction, paths, children, run_ids)

        return sweep_id, write

    @staticmethod
    def _created(sweep_id: str, spec: SweepSpec, queued: list[dict[str, Any]]) -> dict[str, Any]:
        log.info("sweep %s (%s): %d runs queued", sweep_id, spec.name, len(queued))
        return {"sweep_id": sweep_id, "name": spec.name, "status": "queued", "n_runs": len(queued),
                "run_ids": [q["run_id"] for q in queued]}

    # --- read -----------------------------------------------------------------------------------------

    def require(self, sweep_id: str) -> dict[str, Any]:
        sweep = self.records.get(sweep_id)
        if sweep is None:
            raise ApiError(404, f"no sweep {sweep_id!r}")
        return sweep

    def table(self, sweep_id: str) -> tuple[dict[str, Any], list[tuple[int | None, Row]]]:
        sweep = self.require(sweep_id)
        return sweep, ranked(self.records.rows(sweep_id, sweep["metric"]), sweep["direction"])

    def get(self, sweep_id: str) -> dict[str, Any]:
        """The sweep with its ranked table (every variant's parameters, metric, status, worker_id,
        devices, queue_key, a running one's ``progress``), per-point summary, counts and best variant."""
        version = self.records.version(sweep_id)  # first: a move after it shows at the next poll
        sweep, table = self.table(sweep_id)
        rows = [r for _, r in table]
        top = best(rows, sweep["direction"])
        # a running variant's latest progress (the table's version does not move with it: clients poll)
        progress = last_progress(self.store, [r.run_id for r in rows if r.status == "running" and r.run_id])
        return {
            **{k: sweep[k] for k in ("id", "name", "spec", "n_runs", "cancel_requested", "created_at", "cancelled_at")},
            "status": sweep_status([r.status for r in rows], sweep["cancel_requested"]),
            "objective": {"metric": sweep["metric"], "direction": sweep["direction"]},
            "parameters": sweep["paths"], "counts": counts(rows), "version": version,
            "labels": self._labels(sweep_id, sweep["paths"]),
            "best": top.to_json(1) if top is not None else None,
            "table": [r.to_json(rank) | {"progress": progress.get(r.run_id or "")} for rank, r in table],
            "points": point_summary(rows, sweep["direction"]) if any(r.seed is not None for r in rows) else None,
        }

    def _labels(self, sweep_id: str, paths: list[str]) -> dict[str, str]:
        """The parameters' names by node title (a sweep's graph never changes: worked out once)."""
        if sweep_id not in self._label_cache:
            self._label_cache[sweep_id] = param_labels(self.records.graph(sweep_id), paths)
        return self._label_cache[sweep_id]

    def csv(self, sweep_id: str) -> str:
        sweep, table = self.table(sweep_id)
        return table_csv(table, sweep["paths"], sweep["metric"])

    def list(self, limit: int, offset: int) -> dict[str, Any]:
        sweeps, total = self.records.list(limit, offset)
        out = []
        for s in sweeps:
            c = s.pop("counts")
            status = sweep_status(list(c), s["cancel_requested"])  # which statuses occur is enough
            out.append({**{k: s[k] for k in ("id", "name", "n_runs", "created_at", "cancel_requested")},
                        "objective": {"metric": s["metric"], "direction": s["direction"]},
                        "parameters": s["paths"], "status": status, "counts": c})
        return {"sweeps": out, "total": total}

    async def wait_change(self, sweep_id: str, version: int, timeout: float) -> None:
        """Return when the sweep's version differs from ``version`` or after ``timeout`` seconds."""
        self.require(sweep_id)
        active: list[str] = []

        def signals() -> list[asyncio.Event]:
            active[:] = self.records.active_run_ids(sweep_id)
            return [self.dispatcher.hub.waiter(rid) for rid in active]

        await wait_for_change(lambda: self.records.version(sweep_id) != version or not active, signals, timeout,
                              VERSION_RECHECK_S)

    # --- cancel / delete ------------------------------------------------------------------------------

    async def cancel(self, sweep_id: str, reason: str | None = None) -> dict[str, Any]:
        """Queued children end now, then started ones are asked to stop; the sweep is marked cancelled."""
        sweep = self.require(sweep_id)
        self.records.request_cancel(sweep_id)
        rows = await asyncio.to_thread(self.records.rows, sweep_id, sweep["metric"])
        why = f"sweep {sweep['name']} cancelled" + (f": {reason}" if reason else "")
        # Queued ones first, all at once (none of them can start meanwhile), their records in a few batched
        # transactions in a worker thread: 5,000 one by one stalled the loop for 7 s (issue 19).
        ended = await self.dispatcher.cancel_queued([r.run_id for r in rows if r.status == "queued"], why)
        for r in rows:  # then the started ones (and any that started while the rows were read)
            if r.status in ("queued", "assigned", "running") and r.run_id not in ended:
                with contextlib.suppress(StoreError):  # it ended meanwhile
                    await self.dispatcher.cancel(r.run_id, why)
        return await asyncio.to_thread(self.get, sweep_id)

    def delete(self, sweep_id: str) -> dict[str, Any]:
        """Delete a sweep whose children have all ended: its rows and its children's runs."""
        sweep = self.require(sweep_id)
        rows = self.records.rows(sweep_id, sweep["metric"])
        active = [r for r in rows if r.status in ("queued", "assigned", "running")]
        if active:
            raise ApiError(409, f"sweep {sweep_id} has {len(active)} runs that have not ended: cancel it first "
                                f"(POST /api/sweeps/{sweep_id}/cancel)")
        deleted = 0
        for r in rows:
            if r.run_id and r.status not in ("deleted", "not queued"):
                with contextlib.suppress(StoreError):
                    self.dispatcher.delete(r.run_id)
                    deleted += 1
        self.records.delete(sweep_id)
        return {"deleted": sweep_id, "runs_deleted": deleted}

