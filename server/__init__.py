"""The sidecar (queue, workers, HTTP API), the worker agent, the graph executor and the CLI."""
