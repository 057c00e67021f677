"""The training loop, checkpoints, metrics and run summaries."""
