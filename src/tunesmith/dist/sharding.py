"""Each rank's share of every micro-batch: disjoint, complete, and a pure function.

The per-epoch plan is built for the global micro-batch (micro-batch size x world size),
then every global micro-batch is cut into one contiguous slice per rank:

    global micro-batch   [ a  b | c  d ]      world 2, per_device_train_batch_size 2
    rank 0               [ a  b ]
    rank 1                      [ c  d ]

So 2 ranks x micro-batch 1 see exactly the samples of 1 rank x micro-batch 2, in the
same optimizer steps. A slice left empty (the last, short global micro-batch of an epoch)
is filled with the first sample of the global micro-batch at weight 0, so every rank runs
the same number of forward/backward passes (collectives stay matched) while the filler
adds nothing to the loss or the gradients.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Shard:
    indices: list[int]  # sample indices this rank computes
    live: bool = True  # False: a weight-0 filler (its loss and token counts are ignored)


def shard_batch(global_batch: list[int], rank: int, world: int, micro_bs: int) -> Shard:
    """This rank's slice of one global micro-batch of at most `world * micro_bs` samples."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} outside a world of {world}")
    if len(global_batch) > world * micro_bs:
        raise ValueError(f"global micro-batch of {len(global_batch)} samples exceeds "
                         f"world {world} x micro-batch {micro_bs}")
    if not global_batch:
        raise ValueError("empty global micro-batch")
    part = global_batch[rank * micro_bs:(rank + 1) * micro_bs]
    return Shard(part) if part else Shard(global_batch[:1], live=False)


def shard_plan(plan: list[list[int]], rank: int, world: int, micro_bs: int) -> list[Shard]:
    """Shards of every global micro-batch of a plan, for one rank."""
    return [shard_batch(b, rank, world, micro_bs) for b in plan]
