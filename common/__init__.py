"""The bottom layer: small tools every other part uses (nodes, the predictor, the server) and that use
nothing of the project's but ``constants``. See docs/architecture.md, "Layers"."""
