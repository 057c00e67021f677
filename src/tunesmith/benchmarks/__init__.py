"""Benchmarks users can rerun: `tunesmith bench` (GPU training speed and memory)."""
