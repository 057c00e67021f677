"""Preference items -> one batch holding every completion, so chosen and rejected (and
KTO's mismatched completions) go through the model in one forward.

    unpacked: one row per completion: [chosen of every item | rejected of every item | kl]
    packed:   rows of the packing plan, each holding whole items (all their completions),
              each completion a segment with its own positions (padding-free)

Per completion the batch lists which trained tokens are its own (`seq_index`), so the
objective sums token log-probabilities per completion with one scatter.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from tunesmith.data.batching import Batch, collate, collate_packed
from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.data.packing import PackedRow
from tunesmith.data.preference import PreferenceItem


@dataclass
class PreferenceBatch(Batch):
    seq_index: torch.Tensor | None = None  # [K] int64: the completion of every target
    seq_tokens: torch.Tensor | None = None  # [S] float32: trained tokens per completion
    last_index: torch.Tensor | None = None  # [S] int64: flat position of its last token
    chosen_pos: torch.Tensor | None = None  # [P] int64 completion index (KTO: the answer)
    rejected_pos: torch.Tensor | None = None  # [P] int64 (empty for KTO)
    kl_pos: torch.Tensor | None = None  # [P] int64, KTO only
    desirable: torch.Tensor | None = None  # [P] bool, KTO only
    ref_chosen: torch.Tensor | None = None  # [P] float32 precomputed reference log-probs
    ref_rejected: torch.Tensor | None = None  # [P]
    ref_kl: torch.Tensor | None = None  # [P]
    n_items: int = 0
    n_seqs: int = 0

    @property
    def loss_units(self) -> int:
        return self.n_items


def collate_preference(items: Sequence[PreferenceItem | PackedRow], pad_id: int
                       ) -> PreferenceBatch:
    packed = isinstance(items[0], PackedRow)
    groups = ([list(r.samples) for r in items] if packed  # type: ignore[union-attr]
              else [[it] for it in items])
    flat = [it for g in groups for it in g]
    parts = [it.completions() for it in flat]  # per item: [(slot, completion)]
    slots: dict[str, list[int]] = {"chosen": [], "rejected": [], "kl": []}
    order: list[EncodedSample] = []  # completions in batch layout order
    layout: list[list[EncodedSample]] = []  # rows of the batch

    def place(slot: str, seq: EncodedSample, row: list[EncodedSample]) -> None:
        slots[slot].append(len(order))
        order.append(seq)
        row.append(seq)

    if packed:  # a row holds whole items
        k = 0
        for g in groups:
            layout.append([])
            for _ in g:
                for slot, seq in parts[k]:
                    place(slot, seq, layout[-1])
                k += 1
    else:  # one row per completion, grouped by slot
        for name in slots:
            for item_parts in parts:
                for slot, seq in item_parts:
                    if slot == name:
                        layout.append([])
                        place(slot, seq, layout[-1])
    return _build(flat, order, layout, slots, pad_id, packed)


def _build(flat: list[PreferenceItem], order: list[EncodedSample],
           layout: list[list[EncodedSample]], slots: dict[str, list[int]], pad_id: int,
           packed: bool) -> PreferenceBatch:
    base = (collate_packed([PackedRow(r) for r in layout], pad_id) if packed
            else collate([r[0] for r in layout], pad_id))
    counts = np.array([int((s.labels[1:] != IGNORE_INDEX).sum()) for s in order], np.int64)
    width = base.input_ids.shape[1]
    last = []
    for r, row in enumerate(layout):  # flat position of every completion's last token
        pos = 0
        for s in row:
            pos += len(s)
            last.append(r * width + pos - 1)
    kto = any(it.kl is not None for it in flat)

    def idx(name: str) -> torch.Tensor:
        return torch.tensor(slots[name], dtype=torch.int64)

    fields = {f: getattr(base, f) for f in Batch.__dataclass_fields__}
    return PreferenceBatch(
        **fields, seq_index=torch.from_numpy(np.repeat(np.arange(len(order)), counts)),
        seq_tokens=torch.from_numpy(counts.astype(np.float32)),
        last_index=torch.tensor(last, dtype=torch.int64), chosen_pos=idx("chosen"),
        rejected_pos=idx("rejected"), kl_pos=idx("kl") if kto else None,
        desirable=torch.tensor([it.chosen is not None for it in flat]) if kto else None,
        ref_chosen=_refs(flat, "chosen"), ref_rejected=_refs(flat, "rejected"),
        ref_kl=_refs(flat, "kl"), n_items=len(flat), n_seqs=len(order))


def _refs(flat: list[PreferenceItem], name: str) -> torch.Tensor | None:
    """Precomputed reference log-probs of one slot, when every item carries them."""
    values = [v for it in flat if (v := getattr(it, f"ref_{name}")) is not None]
    if not values or len(values) != sum(1 for it in flat for s, _ in it.completions()
                                        if s == name):
        return None
    return torch.tensor(values, dtype=torch.float32)
