"""Every Slurm pool of a sidecar (docs/slurm-and-k8s.md): its settings and jobs in SQLite, one loop.

Each tick (:data:`SLURM_TICK_S`) reads ``squeue`` once for every pool (jobs are matched by their job
name, ``xpufleet-<tag>``, so a restart — even after kill -9 — finds its jobs again and adopts any it had
submitted but not yet recorded: nothing is submitted twice, nothing is orphaned), then per pool:
records joins and ends, reports a job that ended without joining (Slurm state + the last lines of its
output file) and retries its run with backoff or fails it, plans with :func:`.scaling.plan_scaling`,
cancels and submits, and tells instances idle for ``idle_exit_s`` to leave.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ...common import atomic
from ...common.schema import Schema
from ...common.signals import cancel_and_wait
from ...constants import SLURM_OUTPUT_TAIL_LINES, SLURM_TICK_S, WORKER_NAME_RE
from . import slurmctl
from .scaling import JobView, WaitingRun, plan_scaling, retry_backoff
from .script import JobPaths, instance_name, job_cards, job_name, job_script, sbatch_argv
from .spec import WORKDIR_ROOTS_ENV, SlurmSpec, SpecError, confine_workdir, spec_from_json
from .squeue import GONE, LIVE_STATES, JobStatus, state_text

log = logging.getLogger("xpufleet.slurm")

SCHEMA = Schema("slurm_pools", 1, """
CREATE TABLE IF NOT EXISTS slurm_pools (
    pool TEXT PRIMARY KEY,
    spec TEXT NOT NULL,
    tag TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS slurm_jobs (
    job_id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    run_id TEXT,
    cards INTEGER NOT NULL,
    state TEXT NOT NULL,
    reason TEXT,
    submitted_at REAL NOT NULL,
    joined_at REAL,
    ended_at REAL,
    cancelled INTEGER NOT NULL DEFAULT 0,
    report TEXT
);
CREATE TABLE IF NOT EXISTS slurm_retries (
    run_id TEXT PRIMARY KEY,
    pool TEXT NOT NULL,
    failures INTEGER NOT NULL,
    not_before REAL NOT NULL,
    last_error TEXT
);
""")
ENDED_SHOWN = 10  # ended jobs listed per pool (newest first)


def _write_private(path: Path, text: str) -> None:
    """Write ``text`` to a file only its owner can read (0600), atomically."""
    atomic.write_text(path, text, mode=atomic.PRIVATE)


class SlurmPools:
    """The Slurm side of the pools (one per sidecar; lives on the event loop)."""

    def __init__(self, registry: Any, home: Path, sidecar_url: Callable[[], str | None]) -> None:
        self.registry = registry
        self.store = registry.ctx.store
        self.dispatcher = registry.ctx.runs
        self.home = Path(home)
        self.sidecar_url = sidecar_url
        # where a pool's workdir may be beside its own folder (the operator's, read once at start)
        self.workdir_roots = [r for r in os.environ.get(WORKDIR_ROOTS_ENV, "").split(os.pathsep) if r]
        for root in [r for r in self.workdir_roots if not os.path.isabs(r)]:  # fail closed: not a root
            log.error("%s: %r is not an absolute folder; it is not used", WORKDIR_ROOTS_ENV, root)
            self.workdir_roots.remove(root)
        self.errors: dict[str, str] = {}  # pool -> the last Slurm command error (shown with the pool)
        self._idle_since: dict[str, float] = {}
        self._shown: dict[str, Any] = {}  # pool -> what its runs' waiting texts were built from
        self._task: asyncio.Task[Any] | None = None
        self._wake = asyncio.Event()
        SCHEMA.ensure(self.store)
        registry.slurm = self

    # --- pools --------------------------------------------------------------------------------------
    def pools(self) -> dict[str, tuple[SlurmSpec, str]]:
        return {r["pool"]: (spec_from_json(json.loads(r["spec"])), r["tag"])
                for r in self.store.query("SELECT * FROM slurm_pools ORDER BY pool")}

    def paths(self, pool: str, spec: SlurmSpec) -> JobPaths:
        return JobPaths.under(spec.workdir or str(self.home / "slurm" / pool))

    def confine(self, pool: str, spec: SlurmSpec) -> None:
        """SpecError unless the pool's workdir is its own folder's, or inside one the operator allows."""
        if spec.workdir is None:
            return
        own = [str(self.home / "slurm" / pool)] if WORKER_NAME_RE.match(pool) else []
        confine_workdir(spec.workdir, own + self.workdir_roots)

    def _workdir_problem(self, pool: str, spec: SlurmSpec) -> str | None:
        try:
            self.confine(pool, spec)
        except SpecError as exc:  # a pool stored before the check, or a root the operator has since removed
            return str(exc)
        return None

    def insert(self, db: Any, pool: str, spec: SlurmSpec) -> None:
        """In the transaction that creates the pool."""
        db.execute("INSERT INTO slurm_pools(pool, spec, tag) VALUES (?,?,?)",
                   (pool, json.dumps(spec.to_json()), secrets.token_hex(6)))

    def set_credential(self, pool: str, spec: SlurmSpec, token: str) -> None:
        """The pool's credential for its jobs: a 0600 file in the pool's folder (never on a command line)."""
        problem = self._workdir_problem(pool, spec)
        if problem:
            raise SpecError(problem)
        paths = self.paths(pool, spec)
        Path(paths.workdir).mkdir(parents=True, exist_ok=True, mode=0o700)
        _write_private(Path(paths.credential), token + "\n")
        self._write_server(pool, spec)
        self.wake()

    def credential(self, pool: str, spec: SlurmSpec) -> str | None:
        """The credential the pool's jobs use (None when its file is gone)."""
        try:
            return Path(self.paths(pool, spec).credential).read_text().strip() or None
        except OSError:
            return None

    def _write_server(self, pool: str, spec: SlurmSpec) -> None:
        url = spec.server_url or self.sidecar_url() or ""
        fingerprint = self.registry.tls_fingerprint() if url.startswith("https://") else None
        text = f"{url}\n{fingerprint or ''}\n"
        path = Path(self.paths(pool, spec).server)
        with contextlib.suppress(OSError):
            if path.read_text() == text:
                return
        with contextlib.suppress(OSError):
            _write_private(path, text)

    async def remove(self, pool: str) -> None:
        """The pool is deleted: cancel its live jobs, forget it and its credential file."""
        entry = self.pools().get(pool)
        if entry is None:
            return
        live = [r["job_id"] for r in self._jobs(pool) if r["state"] in LIVE_STATES]
        with contextlib.suppress(slurmctl.SlurmError):
            await slurmctl.cancel(live)
        with self.store.transaction() as db:
            for table in ("slurm_pools", "slurm_jobs", "slurm_retries"):
                db.execute(f"DELETE FROM {table} WHERE pool=?", (pool,))
        with contextlib.suppress(OSError):
            os.unlink(self.paths(pool, entry[0]).credential)

    # --- what the pool shows ------------------------------------------------------------------------
    def _jobs(self, pool: str) -> list[Any]:
        return self.store.query("SELECT * FROM slurm_jobs WHERE pool=? ORDER BY CAST(job_id AS INTEGER)", (pool,))

    def describe(self, pool: str) -> dict[str, Any] | None:
        """``{"slurm": settings, "jobs": [...]}`` of a Slurm pool (None for another pool)."""
        entry = self.pools().get(pool)
        if entry is None:
            return None
        spec, tag = entry
        rows = self._jobs(pool)
        live = [r for r in rows if r["state"] in LIVE_STATES]
        ended = sorted((r for r in rows if r["state"] not in LIVE_STATES), key=lambda r: -(r["ended_at"] or 0))
        jobs = [{"id": r["job_id"], "state": r["state"], "reason": r["reason"],
                 "status": state_text(r["state"], r["reason"]), "run_id": r["run_id"],
                 "instance": instance_name(pool, r["job_id"]), "joined": r["joined_at"] is not None,
                 "cards": r["cards"], "submitted_at": r["submitted_at"], "ended_at": r["ended_at"],
                 "report": r["report"]} for r in live + ended[:ENDED_SHOWN]]
        return {"slurm": {**spec.to_json(), "job_name": job_name(tag), "workdir": self.paths(pool, spec).workdir,
                          "error": self.errors.get(pool)}, "jobs": jobs}

    def reason(self, pool: str, run_id: str | None) -> str | None:
        """A waiting run's reason when its pool is a Slurm pool (None: the pool's own text)."""
        entry = self.pools().get(pool)
        if entry is None or run_id is None:
            return None
        spec = entry[0]
        rows = self._jobs(pool)
        mine = [r for r in rows if r["run_id"] == run_id and r["state"] in LIVE_STATES and r["joined_at"] is None]
        if mine:
            r = mine[-1]
            return f"waiting for Slurm job {r['job_id']}: {state_text(r['state'], r['reason'])}"
        retry = self.store.query("SELECT * FROM slurm_retries WHERE run_id=?", (run_id,))
        if retry:
            return (f"{retry[0]['last_error']}; attempt {retry[0]['failures'] + 1} of {spec.retries + 1} "
                    f"follows after a backoff")
        if self.errors.get(pool):
            return f"waiting for a Slurm job of pool {pool}: {self.errors[pool]}"
        live = sum(1 for r in rows if r["state"] in LIVE_STATES)
        if live >= spec.max_jobs:
            return (f"waiting for a Slurm job of pool {pool}: {live} job(s) pending or running, the pool's "
                    f"max_jobs is {spec.max_jobs}")
        return f"waiting for pool {pool} to submit a Slurm job"

    def instance_joined(self, name: str, pool: str) -> None:
        """An instance joined: if it is one of the pool's jobs, that job has joined."""
        for r in self._jobs(pool):
            if r["joined_at"] is None and instance_name(pool, r["job_id"]) == name:
                with self.store.transaction() as db:
                    db.execute("UPDATE slurm_jobs SET joined_at=? WHERE job_id=?", (time.time(), r["job_id"]))
                self.wake()

    # --- the loop -------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        """Server stopping: the jobs go on (the next sidecar adopts them from squeue)."""
        if self._task is not None:
            await cancel_and_wait([self._task])
            self._task = None

    async def _loop(self) -> None:
        while True:
            try:
                await self.tick()
            except Exception:  # noqa: BLE001 - one bad tick must not end scaling
                log.exception("Slurm pools: tick failed")
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), SLURM_TICK_S)

    async def tick(self) -> None:
        """Read squeue once, then reconcile, plan, cancel and submit for each pool."""
        # off the loop: a sweep's thousands of inserts hold the store's lock for a second or more
        pools = await asyncio.to_thread(self.pools)
        if not pools:
            return
        try:
            statuses = await slurmctl.query([job_name(tag) for _, tag in pools.values()])
        except slurmctl.SlurmError as exc:
            for pool in pools:
                self.errors[pool] = f"squeue: {exc}"
            self._explain(pools)
            return
        for pool, (spec, tag) in pools.items():
            self.errors.pop(pool, None)
            problem = self._workdir_problem(pool, spec)
            if problem:  # nothing is written or submitted there
                self.errors[pool] = problem
                continue
            self._write_server(pool, spec)
            self._reconcile(pool, spec, [s for s in statuses if s.name == job_name(tag)])
            await self._scale(pool, spec, tag)
            await self._dismiss_idle(pool, spec)
        self._explain(pools)

    def _reconcile(self, pool: str, spec: SlurmSpec, statuses: list[JobStatus]) -> None:
        """Job states from squeue: adopt unknown jobs, record joins and ends, report failed ones."""
        now = time.time()
        known = {r["job_id"]: r for r in self._jobs(pool)}
        online = set(self.registry.workers)
        with self.store.transaction() as db:
            for s in statuses:
                if s.job_id not in known and s.live:  # submitted by a sidecar that died before recording it
                    log.info("Slurm pool %s: adopting job %s (%s)", pool, s.job_id, s.text)
                    db.execute("INSERT INTO slurm_jobs(job_id, pool, run_id, cards, state, reason, submitted_at) "
                               "VALUES (?,?,?,?,?,?,?)", (s.job_id, pool, None, spec.gres_parts()[1], s.state,
                                                          s.reason, now))
        seen = {s.job_id: s for s in statuses}
        for r in self._jobs(pool):
            if r["state"] not in LIVE_STATES:
                continue
            s = seen.get(r["job_id"])
            state, reason = (s.state, s.reason) if s is not None else (GONE, "not listed by squeue any more")
            joined = r["joined_at"] or (now if instance_name(pool, r["job_id"]) in online else None)
            ended = state not in LIVE_STATES
            report = None
            if ended and joined is None and not r["cancelled"]:
                report = self._failed(pool, spec, r, state_text(state, reason))
            with self.store.transaction() as db:
                db.execute("UPDATE slurm_jobs SET state=?, reason=?, joined_at=?, ended_at=?, report=? "
                           "WHERE job_id=?", (state, reason, joined, now if ended else None, report, r["job_id"]))
            if ended:
                shutil.rmtree(Path(self.paths(pool, spec).workdir) / f"home-{r['job_id']}", ignore_errors=True)

    def _failed(self, pool: str, spec: SlurmSpec, row: Any, status: str) -> str:
        """A job ended without joining: its report; its run is retried with backoff or fails."""
        tail = slurmctl.output_tail(self.paths(pool, spec).output_of(row["job_id"]), SLURM_OUTPUT_TAIL_LINES)
        out = " | ".join(tail) if tail else "(no output)"
        report = f"Slurm job {row['job_id']} ended without joining pool {pool}: {status}; its output ends: {out}"
        log.warning("%s", report)
        run_id = row["run_id"]
        if run_id is None or not self._queued(run_id):
            return report
        prev = self.store.query("SELECT failures FROM slurm_retries WHERE run_id=?", (run_id,))
        self._count_failure(pool, spec, run_id, (prev[0]["failures"] if prev else 0) + 1, report)
        return report

    def _count_failure(self, pool: str, spec: SlurmSpec, run_id: str, failures: int, report: str) -> None:
        if failures > spec.retries:
            self.dispatcher.run_ended(run_id, "failed", f"{report} (after {failures} attempt(s))")
            with self.store.transaction() as db:
                db.execute("DELETE FROM slurm_retries WHERE run_id=?", (run_id,))
            return
        with self.store.transaction() as db:
            db.execute("INSERT INTO slurm_retries(run_id, pool, failures, not_before, last_error) VALUES "
                       "(?,?,?,?,?) ON CONFLICT(run_id) DO UPDATE SET failures=excluded.failures, "
                       "not_before=excluded.not_before, last_error=excluded.last_error",
                       (run_id, pool, failures, time.time() + retry_backoff(failures), report))

    def _queued(self, run_id: str) -> bool:
        return bool(self.store.query("SELECT 1 FROM runs WHERE id=? AND status='queued'", (run_id,)))

    def _waiting(self, pool: str, spec: SlurmSpec) -> list[WaitingRun]:
        retries = {r["run_id"]: r["not_before"] for r in
                   self.store.query("SELECT run_id, not_before FROM slurm_retries WHERE pool=?", (pool,))}
        rows = self.store.query("SELECT id, requested FROM runs WHERE status='queued' AND target=? ORDER BY seq",
                                (f"pool:{pool}",))
        return [WaitingRun(r["id"], job_cards(spec, json.loads(r["requested"] or "[]")), retries.get(r["id"], 0.0))
                for r in rows]

    async def _scale(self, pool: str, spec: SlurmSpec, tag: str) -> None:
        rows = self._jobs(pool)
        jobs = [JobView(r["job_id"], r["run_id"], r["cards"], r["state"] in LIVE_STATES, r["state"] == "PENDING",
                        r["joined_at"] is not None) for r in rows]
        idle = [sum(1 for d in st.devices if str(d.get("name", "")).startswith("cuda"))
                for st in self.registry.instances(pool) if st.online and st.taken is None]
        plan = plan_scaling(self._waiting(pool, spec), jobs, idle, spec.max_jobs, time.time())
        with self.store.transaction() as db:
            db.executemany("UPDATE slurm_jobs SET run_id=? WHERE job_id=?", [(r, j) for j, r in plan.assign.items()])
            db.executemany("UPDATE slurm_jobs SET cancelled=1 WHERE job_id=?", [(j,) for j in plan.cancel])
        if plan.cancel:
            log.info("Slurm pool %s: cancelling pending job(s) %s (no run waits for them)", pool, ", ".join(plan.cancel))
            try:
                await slurmctl.cancel(list(plan.cancel))
            except slurmctl.SlurmError as exc:
                self.errors[pool] = f"scancel: {exc}"
        paths = self.paths(pool, spec)
        comfyui = self.registry.pools.directory.comfyui().get(pool)  # its agents run ComfyUI workflows
        for run in plan.submit:
            try:
                job_id = await slurmctl.submit(sbatch_argv(spec, tag, paths, run.cards),
                                               job_script(spec, pool, paths, comfyui))
            except slurmctl.SlurmError as exc:
                prev = self.store.query("SELECT failures FROM slurm_retries WHERE run_id=?", (run.run_id,))
                self._count_failure(pool, spec, run.run_id, (prev[0]["failures"] if prev else 0) + 1,
                                    f"sbatch for pool {pool} failed: {exc}")
                continue
            log.info("Slurm pool %s: job %s submitted for run %s (%d card(s))", pool, job_id, run.run_id, run.cards)
            with self.store.transaction() as db:
                db.execute("INSERT OR IGNORE INTO slurm_jobs(job_id, pool, run_id, cards, state, reason, submitted_at)"
                           " VALUES (?,?,?,?,?,?,?)", (job_id, pool, run.run_id, run.cards, "PENDING", None, time.time()))

    async def _dismiss_idle(self, pool: str, spec: SlurmSpec) -> None:
        """Instances that joined and have taken no run for ``idle_exit_s`` are told to leave."""
        now = time.monotonic()
        for st in self.registry.instances(pool):
            if not st.online or st.taken is not None:
                self._idle_since.pop(st.name, None)
                continue
            since = self._idle_since.setdefault(st.name, now)
            if now - since >= spec.idle_exit_s:
                self._idle_since.pop(st.name, None)
                await self.registry.dismiss(st, f"idle for {spec.idle_exit_s:g} s (Slurm pool {pool}'s idle_exit_s)")

    def _explain(self, pools: dict[str, Any]) -> None:
        """Queued runs of a pool whose Slurm picture changed get their waiting texts again."""
        for pool in pools:
            shown = (tuple((r["job_id"], r["run_id"], r["state"], r["reason"]) for r in self._jobs(pool)),
                     tuple(tuple(r) for r in self.store.query("SELECT * FROM slurm_retries WHERE pool=?", (pool,))),
                     self.errors.get(pool))
            if self._shown.get(pool) != shown:
                self._shown[pool] = shown
                self.dispatcher.explain_again([r.run_id for r in self._waiting(pool, pools[pool][0])])
