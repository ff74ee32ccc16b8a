"""The worker agent (docs/workers.md, docs/architecture.md): ``xpufleet agent start`` dials the sidecar and runs runs."""
