"""Training objectives: small objects the loop calls; each returns a *sum* of token losses.

The loop divides by the number of target tokens of the whole optimizer step, so gradient
accumulation over micro-batches equals one large batch.
"""

from __future__ import annotations

from typing import Protocol

import torch

from tunesmith.data.batching import Batch
from tunesmith.kernels.linear_ce import (
    chunked_linear_cross_entropy,
    linear_cross_entropy_reference,
)
from tunesmith.models.loader import split_causal_lm


class Objective(Protocol):
    def loss_sum(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor: ...


def auto_chunk_rows(vocab: int, budget_bytes: int = 512 << 20) -> int:
    """Largest power of two of rows whose fp32 logits fit the budget (at least 64)."""
    rows = max(64, budget_bytes // (4 * vocab))
    return 1 << (rows.bit_length() - 1)


def trunk_inputs(batch: Batch) -> dict:
    """Keyword inputs of the decoder trunk for a batch: padded batches pass their attention
    mask; packed (padding-free) batches pass restarting position ids and the segment
    boundaries that varlen attention reads (transformers forwards them to it)."""
    cu = getattr(batch, "cu_seqlens", None)
    if cu is None:
        # no padding at all: no mask, so attention takes its plain causal path
        dense = batch.n_tokens == batch.input_ids.numel()
        return {"attention_mask": None if dense else batch.attention_mask}
    return {"position_ids": batch.position_ids, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
            "max_length_q": batch.max_seqlen, "max_length_k": batch.max_seqlen}


class NextTokenObjective:
    """Cross-entropy on the trained next tokens (SFT: assistant tokens; pt: all tokens),
    computed from hidden states so the full logits are never materialised."""

    def __init__(self, loss_impl: str = "chunked", chunk_size: int = 0):
        self.loss_impl, self.chunk_size = loss_impl, chunk_size

    def loss_sum(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        trunk, head = split_causal_lm(model)
        out = trunk(input_ids=batch.input_ids, use_cache=False, **trunk_inputs(batch))
        hidden = out.last_hidden_state  # [B, T, H]
        rows = hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.target_index)  # [K, H]
        if getattr(head, "bias", None) is not None:  # rare; the plain path handles the bias
            logits = head(rows).float()
            return torch.nn.functional.cross_entropy(logits, batch.target_ids, reduction="sum")
        if self.loss_impl == "reference":
            return linear_cross_entropy_reference(rows, head.weight, batch.target_ids)
        chunk = self.chunk_size or auto_chunk_rows(head.weight.shape[0])
        return chunked_linear_cross_entropy(rows, head.weight, batch.target_ids, chunk)
