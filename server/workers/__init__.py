"""The sidecar's side of worker agents (docs/sidecar.md, docs/workers.md): the registry (registry.py) of every known
worker, its agent session (session.py), management (management.py), the Workers panel data
(status.py), the dispatcher's view of a worker (provider.py), what is kept in SQLite (records.py) and
the agent <-> sidecar messages (protocol.py, shared with the agent)."""
