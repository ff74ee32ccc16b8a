"""Success-rate predictor (seed 001), device snapshots, memory estimates and the workflow scan."""
