"""Sweeps and studies across workers (docs/sweeps.md, issue 15).

Pure parts (no I/O): ``params`` (a node parameter's path in the graph and its values: lists, ranges, log
ranges, grid points, random draws), ``spec`` (the bodies of ``POST /api/sweeps`` and ``POST /api/studies``:
seeds, objective, pruner, sampler, caps that reject rather than truncate), ``expand`` (a sweep -> its
variants -> each child's ``POST /api/runs`` body), ``ranking`` (the ranked table, per-point summary, CSV).

I/O parts: ``records`` (the tables in the sidecar's SQLite, through ``Store.ensure_schema``), ``driver``
(:class:`SweepService`: the whole-batch check through the dispatcher's own per-run admission, children
queued in one transaction, cancel, delete), ``study`` (:class:`StudyService`: Optuna's ask/tell loop,
pruning from the metrics runs report while they train) and ``optuna_bridge`` (Optuna in one thread, its
storage in the same ``state.db``). The HTTP routes are ``sidecar/routes/sweeps.py`` and ``studies.py``;
the commands ``cli/sweeps.py``.
"""
