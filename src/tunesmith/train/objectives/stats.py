"""Metric sums an objective keeps between log lines (train and eval apart); the loop
drains them, sums them over ranks and writes the means to metrics.jsonl."""

from __future__ import annotations

import torch


class MetricSums:
    def __init__(self) -> None:
        self._sums: dict[str, dict[str, list]] = {"train": {}, "eval": {}}

    def add(self, split: str, name: str, values: torch.Tensor, live: bool = True) -> None:
        """Add every element of `values` (one per item) to `name`'s running sum; a filler
        batch (`live` False) adds nothing but its name, so every rank holds the same names
        for the all-reduce."""
        entry = self._sums[split].setdefault(name, [torch.zeros((), dtype=torch.float64,
                                                                device=values.device), 0])
        if live:
            entry[0] += values.detach().double().sum()
            entry[1] += values.numel()

    def drain(self, split: str) -> dict[str, tuple[float, int]]:
        out = {k: (float(v[0]), int(v[1])) for k, v in sorted(self._sums[split].items())}
        self._sums[split] = {}
        return out
