"""Distributed training: launch (torchrun), process group, data sharding, strategy wrapping."""
