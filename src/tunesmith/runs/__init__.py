"""The format of a run's output_dir, read by training, the web UI, eval and export."""
