"""Optuna behind one thread (docs/sweeps.md: a study's search is Optuna's; its storage is the sidecar's SQLite).

Storage: Optuna's own ``RDBStorage`` on the sidecar's ``state.db`` (``sqlite:///$XPUFLEET_HOME/state.db``).
Why the same file rather than a sibling one: docs/sweeps.md asks for the study's storage "in the same SQLite";
one file holds everything a restart needs and is backed up as one; Optuna's tables (``studies``,
``trials``, ``trial_*``, ``study_*``, ``version_info``, ``alembic_version``) do not clash with the
sidecar's (``runs``, ``events``, ``workers*``, ``sweeps``, ``sweep_variants``, ``xpufleet_studies``,
``xpufleet_study_trials``); the file is in WAL mode (set by the store, a property of the file), so
Optuna's connection and the store's never block readers, and each writer holds the lock for one short
transaction (Optuna's connection waits up to 30 s for it rather than failing).

Threading: every Optuna call (storage creation with its migrations, ``ask``, ``report``,
``should_prune``, ``tell``) runs in ONE worker thread (:meth:`OptunaBridge.call`), so the sidecar's event
loop never waits for Optuna, and Optuna's calls never race each other. ``optuna`` is imported there,
lazily: a sidecar that runs no study never imports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from .params import Choice, Param
from .spec import StudySpec

log = logging.getLogger("xpufleet.studies")
T = TypeVar("T")

SQLITE_LOCK_WAIT_S = 30  # Optuna's connection waits this long for the write lock instead of failing
FINISHED = ("complete", "pruned", "failed")


def distributions(params: Sequence[Param]) -> dict[str, Any]:
    """Optuna distributions of the study's parameters (paths as names)."""
    import optuna

    out: dict[str, Any] = {}
    for p in params:
        d = p.domain
        if isinstance(d, Choice):
            out[p.path] = optuna.distributions.CategoricalDistribution(list(d.values))
        elif d.kind == "int":
            out[p.path] = optuna.distributions.IntDistribution(int(d.low), int(d.high), log=d.log,
                                                               step=int(d.step or 1))
        else:
            out[p.path] = optuna.distributions.FloatDistribution(float(d.low), float(d.high), log=d.log,
                                                                 step=d.step)
    return out


def sampler_for(spec: StudySpec) -> Any:
    import optuna

    if spec.sampler.kind == "random":
        return optuna.samplers.RandomSampler(seed=spec.sampler.seed)
    return optuna.samplers.TPESampler(seed=spec.sampler.seed)


def pruner_for(spec: StudySpec) -> Any:
    import optuna

    p = spec.pruner
    if p.kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=p.n_startup_trials, n_warmup_steps=p.n_warmup_steps,
                                           interval_steps=p.interval_steps)
    return optuna.pruners.NopPruner()


def reported_value(spec: StudySpec, value: float) -> float:
    """What a trial reports to Optuna for a value of the pruning metric: Optuna's pruners compare
    intermediate values in the study's direction, so a metric that runs the other way is negated
    (a study maximising val_accuracy pruned on val_loss_step reports -val_loss_step)."""
    return value if spec.pruner.direction == spec.objective.direction else -value


class OptunaBridge:
    """The sidecar's Optuna: one storage on ``db_path``, one thread, the studies it has loaded."""

    def __init__(self, db_path: str | Path) -> None:
        self.url = f"sqlite:///{Path(db_path).resolve()}"
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="xpufleet-optuna")
        self._storage: Any = None
        self._studies: dict[str, Any] = {}
        self._trials: dict[tuple[str, int], Any] = {}

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(*args)`` in the Optuna thread."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def close(self) -> None:
        await self.call(self._dispose)
        self._executor.shutdown(wait=True)

    # --- in the Optuna thread ---------------------------------------------------------------------

    def _dispose(self) -> None:
        if self._storage is not None:
            with contextlib.suppress(Exception):
                self._storage.engine.dispose()
        self._storage = None
        self._studies.clear()
        self._trials.clear()

    def storage(self) -> Any:
        if self._storage is None:
            import optuna

            optuna.logging.set_verbosity(optuna.logging.WARNING)  # the sidecar logs trials itself
            self._storage = optuna.storages.RDBStorage(
                self.url, engine_kwargs={"connect_args": {"timeout": SQLITE_LOCK_WAIT_S}})
        return self._storage

    def open(self, name: str, spec: StudySpec) -> None:
        """Create the study, or load it after a restart (the sampler and pruner are the spec's)."""
        import optuna

        self._studies[name] = optuna.create_study(
            storage=self.storage(), study_name=name, direction=spec.objective.direction,
            sampler=sampler_for(spec), pruner=pruner_for(spec), load_if_exists=True)

    def ask(self, name: str, spec: StudySpec) -> tuple[int, int, dict[str, Any]]:
        """A new trial: (number, Optuna's trial id, parameter values)."""
        trial = self._studies[name].ask(distributions(spec.params))
        self._trials[(name, trial.number)] = trial
        return trial.number, trial._trial_id, dict(trial.params)

    def _trial(self, name: str, number: int, trial_id: int) -> Any:
        trial = self._trials.get((name, number))
        if trial is None:  # after a restart: the same trial, from the storage
            import optuna

            trial = self._trials[(name, number)] = optuna.trial.Trial(self._studies[name], trial_id)
        return trial

    def reported_steps(self, name: str, trial_id: int) -> list[int]:
        """Steps a trial has reported already (a resumed watcher skips them)."""
        return sorted(self.storage().get_trial(trial_id).intermediate_values)

    def report(self, name: str, number: int, trial_id: int, value: float, step: int, check: bool) -> bool:
        """Report one intermediate value; with ``check``, whether the pruner says stop."""
        trial = self._trial(name, number, trial_id)
        trial.report(value, step)
        return bool(check and trial.should_prune())

    def tell(self, name: str, number: int, trial_id: int, state: str, value: float | None = None) -> None:
        """End a trial: complete (with its value), pruned or failed. A trial already ended is left as is."""
        import optuna

        study = self._studies[name]
        states = {"complete": optuna.trial.TrialState.COMPLETE, "pruned": optuna.trial.TrialState.PRUNED,
                  "failed": optuna.trial.TrialState.FAIL}
        if self.storage().get_trial(trial_id).state.is_finished():
            return
        if state == "complete":
            assert value is not None and math.isfinite(value)
            study.tell(self._trial(name, number, trial_id), value)
        else:
            study.tell(self._trial(name, number, trial_id), state=states[state])
        self._trials.pop((name, number), None)

    def running_trials(self, name: str) -> list[tuple[int, int]]:
        """(number, trial id) of trials Optuna still counts as running."""
        import optuna

        trials = self._studies[name].get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        return [(t.number, t._trial_id) for t in trials]

    def best(self, name: str) -> Mapping[str, Any] | None:
        """Optuna's own best trial (number, value, params), for checks."""
        try:
            t = self._studies[name].best_trial
        except ValueError:
            return None
        return {"number": t.number, "value": t.value, "params": dict(t.params)}

    def delete(self, name: str) -> None:
        import optuna

        self._studies.pop(name, None)
        with contextlib.suppress(KeyError):
            optuna.delete_study(study_name=name, storage=self.storage())
