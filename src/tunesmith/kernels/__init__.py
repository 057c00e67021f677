"""Fused and chunked operations, each with a plain reference twin and a parity test."""
