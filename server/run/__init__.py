"""One run's process (docs/sidecar.md, docs/workers.md): the spec a parent writes, the launcher that starts a group of run
processes, the runner that executes the graph in each, and the graph executor itself."""
