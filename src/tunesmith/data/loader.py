"""Feed collated micro-batches to the loop, in the order of the per-epoch plan.

The plan (`epoch_batches`) is a pure function of (seed, epoch), so the feeder is just an
iterator that starts at the loop's (epoch, batch) position: a resumed run builds a new
one at its saved position. With `dataloader_num_workers > 0` a torch DataLoader collates
ahead in worker processes (its batch sampler walks the same plan); with 0 the loop
collates in-process.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from tunesmith.data.batching import Batch, collate

Plan = Callable[[int], list[list[int]]]  # epoch -> micro-batches (sample indices)


@dataclass
class LoaderOptions:
    batch_tokens: int = 0
    num_workers: int = 0
    pin_memory: bool = True
    prefetch_factor: int = 2
    persistent_workers: bool = True
    flatten: bool = False  # padding_free: each micro-batch one row of its samples


class _PlanSampler:
    """Batch sampler walking the plan from (epoch, position) on, for ever."""

    def __init__(self, plan: Plan, epoch: int, position: int):
        self.plan, self.epoch, self.position = plan, epoch, position

    def __iter__(self) -> Iterator[list[int]]:
        epoch, position = self.epoch, self.position
        while True:
            batches = self.plan(epoch)
            yield from batches[position:]
            epoch, position = epoch + 1, 0


class _Items(torch.utils.data.Dataset):
    def __init__(self, items: Sequence[Any]):
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        return self.items[i]


def batch_iterator(items: Sequence[Any], plan: Plan, epoch: int, position: int, pad_id: int,
                   opts: LoaderOptions, device: torch.device) -> Iterator[Batch]:
    """Collated batches from (epoch, position) on, in plan order."""
    sampler = _PlanSampler(plan, epoch, position)
    if opts.num_workers == 0:
        return (collate([items[i] for i in idx], pad_id, opts.flatten) for idx in sampler)
    loader = torch.utils.data.DataLoader(
        _Items(items), batch_sampler=sampler, collate_fn=partial(collate, pad_id=pad_id, flatten=opts.flatten),
        num_workers=opts.num_workers, pin_memory=opts.pin_memory and device.type == "cuda",
        prefetch_factor=opts.prefetch_factor, persistent_workers=opts.persistent_workers,
        # Its own generator: starting the iterator draws the workers' base seed, and from
        # the global RNG that draw would shift dropout after a resume restored that RNG.
        # Collation uses no randomness, so a fixed seed changes nothing else.
        generator=torch.Generator().manual_seed(0))
    return iter(loader)
