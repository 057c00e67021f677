"""Samples -> padded batches whose loss targets are precomputed on the host.

The loss needs the hidden state at position t for every trained label at t+1. The
collator lists those positions (`target_index`, flattened over [B, T]) and their token ids
once on the CPU, so the training step never synchronises with the GPU to find them.
Packed rows (see packing.py) also carry position ids, segment ids and cu_seqlens; a target
never crosses a sample boundary inside a row.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import torch

from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.data.packing import PackedRow
from tunesmith.data.vision_batch import has_media, vision_fields


@dataclass
class Batch:
    input_ids: torch.Tensor  # [B, T] int64
    attention_mask: torch.Tensor  # [B, T] int64, 0 on padding
    target_index: torch.Tensor  # [K] int64 flat positions in [B*T] whose next token is trained
    target_ids: torch.Tensor  # [K] int64
    n_targets: int
    n_tokens: int  # real (non-pad) tokens
    # packed batches only (None otherwise):
    position_ids: torch.Tensor | None = None  # [B, T] int64, restarting at 0 per sample
    segment_ids: torch.Tensor | None = None  # [B, T] int64, 1..k per row, 0 on padding
    cu_seqlens: torch.Tensor | None = None  # [n_segments + 1] int32 over the flat [B*T]
    max_seqlen: int = 0
    # vision-language batches only (see vision_batch.py):
    pixel_values: torch.Tensor | None = None  # [N, D] patches of the images, token order
    image_grid_thw: torch.Tensor | None = None  # [n_images, 3] int64
    pixel_values_videos: torch.Tensor | None = None  # [N', D]
    video_grid_thw: torch.Tensor | None = None  # [n_videos, 3] int64
    mrope_position_ids: torch.Tensor | None = None  # [3, B, T] int64, per sample
    # False: a weight-0 filler shard of a distributed step; objectives keep it out of their
    # statistics (metric means, KTO's KL estimate) but still take part in collectives
    live: bool = True

    def to(self, device: torch.device) -> Batch:
        nb = device.type == "cuda"
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.to(device, non_blocking=nb)
        return type(self)(**moved)

    def pin_memory(self) -> Batch:
        """Called by DataLoader(pin_memory=True) on custom batch types."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        for name, value in moved.items():
            if isinstance(value, torch.Tensor):
                moved[name] = value.pin_memory()
        return type(self)(**moved)

    @property
    def loss_units(self) -> int:
        """What the loop divides the step's loss sum by: trained tokens here; a batch type
        whose loss is per item (preference pairs) counts items."""
        return self.n_targets

    def lengths(self) -> list[int]:
        """Real length of every sample in the batch (several per row when packed)."""
        if self.segment_ids is None:
            return [int(n) for n in self.attention_mask.sum(dim=1).tolist()]
        out: list[int] = []
        for row in self.segment_ids:
            ids, counts = torch.unique_consecutive(row, return_counts=True)
            out += [int(c) for c in counts[ids > 0].tolist()]
        return out


def collate(samples: Sequence[EncodedSample | PackedRow], pad_id: int,
            flatten: bool = False) -> Batch:
    """Right-pad to the longest sample (or packed row) of the batch. Items that bring their
    own batch type (preference items) are collated by it. `flatten` (padding_free): plain
    text samples of different lengths become one row, back to back, as a packed row of
    exactly these samples (samples of one length have no padding to remove)."""
    first = samples[0] if samples else None
    inner = first.samples[0] if isinstance(first, PackedRow) and first.samples else first
    if hasattr(inner, "collate_items"):
        return inner.collate_items(samples, pad_id)  # type: ignore[union-attr]
    if samples and isinstance(samples[0], PackedRow):
        return collate_packed(samples, pad_id)  # type: ignore[arg-type]
    if flatten and len({len(s) for s in samples}) > 1 and not has_media([[s] for s in samples]):
        return collate_packed([PackedRow(list(samples))], pad_id)  # type: ignore[arg-type]
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
    rows = [[s] for s in samples]
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(target_index),
                 torch.from_numpy(target_ids), int(len(target_ids)), int(mask.sum()),
                 **(vision_fields(rows, t_max) if has_media(rows) else {}))


def collate_packed(rows: Sequence[PackedRow], pad_id: int) -> Batch:
    """Packed rows -> a batch with per-sample positions, segments and cu_seqlens."""
    t_max = max(len(r) for r in rows)
    b = len(rows)
    ids = np.full((b, t_max), pad_id, dtype=np.int64)
    mask = np.zeros((b, t_max), dtype=np.int64)
    pos_ids = np.zeros((b, t_max), dtype=np.int64)
    seg = np.zeros((b, t_max), dtype=np.int64)
    idx_parts, tgt_parts, seqlens = [], [], []
    for i, row in enumerate(rows):
        start = 0
        for k, s in enumerate(row.samples, start=1):
            n = len(s)
            ids[i, start:start + n] = s.input_ids
            pos_ids[i, start:start + n] = np.arange(n)
            seg[i, start:start + n] = k
            nxt = s.labels[1:]  # targets stay inside the sample
            pos = np.flatnonzero(nxt != IGNORE_INDEX)
            idx_parts.append(pos + i * t_max + start)
            tgt_parts.append(nxt[pos])
            seqlens.append(n)
            start += n
        mask[i, :start] = 1
        pos_ids[i, start:] = np.arange(t_max - start)
        if start < t_max:
            seqlens.append(t_max - start)  # the row's padding is a segment of its own
    target_index = np.concatenate(idx_parts).astype(np.int64)
    target_ids = np.concatenate(tgt_parts).astype(np.int64)
    cu = np.zeros(len(seqlens) + 1, dtype=np.int32)
    np.cumsum(seqlens, out=cu[1:])
    grouped = [r.samples for r in rows]
    return Batch(torch.from_numpy(ids), torch.from_numpy(mask), torch.from_numpy(target_index),
                 torch.from_numpy(target_ids), int(len(target_ids)), int(mask.sum()),
                 position_ids=torch.from_numpy(pos_ids), segment_ids=torch.from_numpy(seg),
                 cu_seqlens=torch.from_numpy(cu), max_seqlen=int(max(seqlens)),
                 **(vision_fields(grouped, t_max) if has_media(grouped) else {}))


def epoch_batches(n_samples: int, batch_size: int, epoch: int, seed: int,
                  lengths: np.ndarray | None = None, batch_tokens: int = 0) -> list[list[int]]:
    """Sample indices of every micro-batch of an epoch; a pure function of its arguments,
    so a resumed run (or another rank) can jump to any position without replaying data.

    With `batch_tokens`, micro-batches hold samples of similar length, at most
    `batch_tokens` padded tokens each: samples are sorted by length (ties in a seeded random
    order), cut greedily, and the batches shuffled. The number of batches depends only on
    the lengths, so it is the same every epoch."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    order = torch.randperm(n_samples, generator=g).tolist()
    if not batch_tokens:
        return [order[i:i + batch_size] for i in range(0, n_samples, batch_size)]
    assert lengths is not None, "batch_tokens needs the sample lengths"
    shuffled = np.asarray(order, dtype=np.int64)
    by_length = shuffled[np.argsort(np.asarray(lengths)[shuffled], kind="stable")]
    batches = token_budget_batches(by_length, np.asarray(lengths), batch_tokens)
    perm = torch.randperm(len(batches), generator=g).tolist()
    return [batches[i] for i in perm]


def token_budget_batches(order: np.ndarray, lengths: np.ndarray, budget: int) -> list[list[int]]:
    """Cut `order` (ascending length) into batches with len(batch) * max_len <= budget
    (a sample longer than the budget gets a batch of its own)."""
    batches: list[list[int]] = []
    current: list[int] = []
    for i in order.tolist():
        n = int(lengths[i])
        if current and (len(current) + 1) * max(n, int(lengths[current[-1]])) > budget:
            batches.append(current)
            current = []
        current.append(i)
    if current:
        batches.append(current)
    return batches


def steps_per_epoch(n_samples: int, batch_size: int, accumulation: int,
                    n_batches: int | None = None) -> int:
    batches = n_batches if n_batches is not None else math.ceil(n_samples / batch_size)
    return math.ceil(batches / accumulation)
