"""Distributed inference Units (docs/services.md): services whose replicas are *units*, each a
group of ``size`` instances on worker cards (one card per instance, a unit may span several workers)
that work as one over torch.distributed, take traffic only through rank 0, restart as one (guard) and
are replaced whole by a rolling update.

Pure parts (no I/O, tested directly): ``spec`` (the service body, validated), ``lifecycle`` (instance
and unit states, the guard decision, the restart budget with exponential backoff), ``routing`` (least
outstanding requests among ready units), ``rollout`` (the make-before-break update plan), ``envcontract``
(the U2 environment), ``lws`` (the Kubernetes LeaderWorkerSet export), ``split`` (pipeline stages).

I/O parts: ``records`` and ``persist`` (typed records in the sidecar's SQLite), ``manager`` and
``control`` (the sidecar's orchestration: placement through the dispatcher's slots, instances started
on agents, readiness, guard, updates), ``router`` (``POST /api/services/{name}/infer`` to rank 0),
``model_server`` (the built-in program) and ``starter`` (its warm start on agents).
"""
