"""The worker agent (SPEC W1-W4, W6): ``xpufleet agent start`` dials the sidecar and runs runs."""
