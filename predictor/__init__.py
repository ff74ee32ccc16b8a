"""Success-rate predictor (docs/predictor.md), device snapshots, memory estimates and the workflow scan."""
