"""Pack samples into rows of `cutoff_len` tokens without cross-contamination.

Bins are filled best-fit decreasing: samples from longest to shortest, each into the open
row whose free space is smallest but still enough (a new row when none fits). The plan is
a pure function of the sample lengths, so it is the same on every rank and every resume;
the epoch order then shuffles whole rows.

    row:      [ s1 s1 s1 s1 | s2 s2 s2 | s3 s3 | pad pad ]
    position:   0  1  2  3    0  1  2    0  1    0   1
    segment:    1  1  1  1    2  2  2    3  3    0   0
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tunesmith.data.encode import EncodedSample


def pack_best_fit_decreasing(lengths: np.ndarray, capacity: int) -> list[list[int]]:
    """Sample indices of every row; each row's lengths sum to at most `capacity`."""
    order = np.argsort(-np.asarray(lengths), kind="stable")
    free: list[tuple[int, int]] = []  # (free space, row id), kept sorted
    rows: list[list[int]] = []
    for i in order.tolist():
        n = int(lengths[i])
        if n > capacity:
            raise ValueError(f"sample {i} has {n} tokens, more than the row size {capacity}")
        k = bisect.bisect_left(free, (n, -1))
        if k == len(free):
            rows.append([i])
            bisect.insort(free, (capacity - n, len(rows) - 1))
            continue
        space, row = free.pop(k)
        rows[row].append(i)
        bisect.insort(free, (space - n, row))
    return rows


@dataclass
class PackedRow:
    """Several samples that share one row of a batch."""

    samples: list[EncodedSample]

    def __len__(self) -> int:
        return sum(len(s) for s in self.samples)


class PackedSamples(Sequence[PackedRow]):
    """The rows of a packing plan over a sequence of samples (built lazily per item)."""

    def __init__(self, samples: Sequence[EncodedSample], lengths: np.ndarray, capacity: int):
        self.samples, self.capacity = samples, capacity
        self.rows = pack_best_fit_decreasing(lengths, capacity)
        self.lengths = np.array([int(lengths[r].sum()) for r in self.rows], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return PackedRow([self.samples[j] for j in self.rows[i]])

    def efficiency(self) -> float:
        """Real tokens / token slots of the packed rows."""
        slots = len(self.rows) * self.capacity
        return float(self.lengths.sum()) / slots if slots else 0.0

    def stats(self) -> dict[str, float | int]:
        n = sum(len(r) for r in self.rows)
        return {"packed_rows": len(self.rows), "packed_samples": n,
                "samples_per_row": round(n / max(len(self.rows), 1), 3),
                "packing_efficiency": round(self.efficiency(), 4)}
