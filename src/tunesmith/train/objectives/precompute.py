"""`precompute_ref_log_probs`: one no-grad pass of the reference over the data before
training; the values ride along with each item into its batch, so training runs no
reference forward at all."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import torch
from tqdm.auto import tqdm

from tunesmith.data.batching import collate
from tunesmith.data.preference import PreferenceItem

RefFn = Callable[[object], torch.Tensor]  # batch (on device) -> completion log-prob sums [S]


class WithReference(Sequence[PreferenceItem]):
    """Items of `items` carrying their precomputed reference log-probs."""

    def __init__(self, items: Sequence[PreferenceItem], values: dict[str, np.ndarray]):
        self.items, self.values = items, values
        self.lengths = getattr(items, "lengths", None)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        item = self.items[i]
        refs = {f"ref_{slot}": float(self.values[slot][i]) for slot, _ in item.completions()}
        return replace(item, **refs)

    def source(self, i: int) -> str:
        return self.items.source(i)  # type: ignore[attr-defined]


def precompute_reference(items: Sequence[PreferenceItem], ref_fn: RefFn, pad_id: int,
                         batch_size: int, device: torch.device) -> WithReference:
    """Reference log-prob sums of every completion of every item, in batches."""
    values = {k: np.full(len(items), np.nan, np.float64) for k in ("chosen", "rejected", "kl")}
    for lo in tqdm(range(0, len(items), batch_size), desc="reference log-probs", unit="batch",
                   disable=len(items) < 64):
        idx = list(range(lo, min(lo + batch_size, len(items))))
        batch = collate([items[i] for i in idx], pad_id).to(device)
        sums = ref_fn(batch).double().cpu().numpy()  # [S]
        for slot, pos in (("chosen", batch.chosen_pos), ("rejected", batch.rejected_pos),
                          ("kl", batch.kl_pos)):
            if pos is None or len(pos) == 0:
                continue
            owners = [i for i in idx if any(s == slot for s, _ in items[i].completions())]
            values[slot][owners] = sums[pos.cpu().numpy()]
    return WithReference(items, values)
