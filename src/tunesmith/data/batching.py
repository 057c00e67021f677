"""Samples -> padded batches whose loss targets are precomputed on the host.

The loss needs the hidden state at position t for every trained label at t+1. The
collator lists those positions (`target_index`, flattened over [B, T]) and their token ids
once on the CPU, so the training step never synchronises with the GPU to find them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from tunesmith.data.encode import IGNORE_INDEX, EncodedSample


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] int64, 0 on padding
    target_index: torch.Tensor  # [K] int64 flat positions in [B*T] whose next token is trained
    target_ids: torch.Tensor  # [K] int64
    n_targets: int
    n_tokens: int  # real (non-pad) tokens
    # packed (padding-free) batches only:
    position_ids: torch.Tensor | None = None  # [B, T] restarting at 0 in every sample
    segment_ids: torch.Tensor | None = None  # [B, T] 1..k per row, 0 on padding
    cu_seqlens: torch.Tensor | None = None  # [n+1] int32 over the flattened [B*T] tokens
    max_seqlen: int = 0

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=nb)

        return Batch(move(self.input_ids), move(self.attention_mask), move(self.target_index),
                     move(self.target_ids), self.n_targets, self.n_tokens,
                     move(self.position_ids), move(self.segment_ids), move(self.cu_seqlens),
                     self.max_seqlen)

    def lengths(self) -> list[int]:
        """Real length of every sample in the batch (several per row when packed)."""
        if self.segment_ids is None:
            return [int(n) for n in self.attention_mask.sum(dim=1).tolist()]
        out: list[int] = []
        for row in self.segment_ids:
            ids, counts = torch.unique_consecutive(row, return_counts=True)
            out += [int(c) for c in counts[ids > 0].tolist()]
        return out


def collate(samples: list[EncodedSample], pad_id: int) -> Batch:
    """Right-pad to the longest sample of the batch."""
    t_max = max(len(s) for s in samples)
    b = len(samples)
    ids = np.full((b, t_max), pad_id, dtype=np.int64)
    mask = np.zeros((b, t_max), dtype=np.int64)
    idx_parts, tgt_parts = [], []
    for i, s in enumerate(samples):
        n = len(s)
        ids[i, :n] = s.input_ids
        mask[i, :n] = 1
        nxt = s.labels[1:]
        pos = np.flatnonzero(nxt != IGNORE_INDEX)
        idx_parts.append(pos + i * t_max)
        tgt_parts.append(nxt[pos])
    target_index = np.concatenate(idx_parts).astype(np.int64)
    target_ids = np.concatenate(tgt_parts).astype(np.int64)
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(target_index),
                 torch.from_numpy(target_ids), int(len(target_ids)), int(mask.sum()))


def epoch_batches(n_samples: int, batch_size: int, epoch: int, seed: int) -> list[list[int]]:
    """Sample indices of every micro-batch of an epoch; a pure function of (epoch, seed),
    so a resumed run can jump to any position without replaying the data."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n_samples, generator=g).tolist()
    return [order[i:i + batch_size] for i in range(0, n_samples, batch_size)]


def steps_per_epoch(n_samples: int, batch_size: int, accumulation: int) -> int:
    return math.ceil(math.ceil(n_samples / batch_size) / accumulation)
