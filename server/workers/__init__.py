"""The sidecar's side of worker agents (docs/sidecar.md, docs/workers.md): the registry (registry.py), a facade over
its parts: the shared worker table (table.py), the agent sessions (session.py), the resume grace (grace.py),
management (management.py), pools (pools.py), recorded outputs (outputs.py), the Workers panel data (status.py);
the dispatcher's view of a worker (provider.py), what is kept in SQLite (records.py), what the parts need of
others (ports.py) and the agent <-> sidecar messages (protocol.py, shared with the agent)."""
