"""Each rank's micro-batches of an optimizer step: disjoint, complete, a pure function.

The epoch plan (data/batching.py) is a list of per-device micro-batches, however it was
built (fixed size or token budget). An optimizer step takes the next
`gradient_accumulation_steps x world` entries and deals them out in turn:

    plan entries of one step    m0  m1 | m2  m3        world 2, accumulation 2
    rank 0                      m0     | m2
    rank 1                          m1 |     m3

With plans built for the same per-device micro-batch size, 2 ranks x micro-batch 1 see
exactly the samples of 1 rank x micro-batch 2 (the plan of size-1 batches is the plan of
size-2 batches cut in halves, same permutation), and a resumed run continues the same plan
whatever its world size. A rank left without an entry (the last, short step of an epoch)
gets a copy of the group's first micro-batch at weight 0, so every rank runs the same
number of forward/backward passes (collectives stay matched) while the filler adds nothing
to the loss or the gradients.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    indices: list[int]  # sample indices of one micro-batch this rank computes
    live: bool = True  # False: a weight-0 filler (its loss and token counts are ignored)


def shard_step(entries: list[list[int]], rank: int, world: int) -> list[Shard]:
    """This rank's micro-batches among the plan entries of one optimizer step."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a world of {world}")
    if not entries:
        raise ValueError("an optimizer step needs at least one micro-batch")
    out = []
    for j in range(math.ceil(len(entries) / world)):
        group = entries[j * world:(j + 1) * world]
        out.append(Shard(group[rank]) if rank < len(group) else Shard(group[0], live=False))
    return out


def steps_in_plan(n_entries: int, accumulation: int, world: int) -> int:
    """Optimizer steps that consume a plan of `n_entries` micro-batches."""
    return math.ceil(n_entries / (accumulation * world))
