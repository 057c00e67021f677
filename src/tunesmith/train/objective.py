"""Training objectives: small objects the loop calls; each returns a *sum* of token losses.

The loop divides by the number of target tokens of the whole optimizer step, so gradient
accumulation over micro-batches equals one large batch.
"""

from __future__ import annotations

from typing import Protocol

import torch

from tunesmith.data.batching import Batch
from tunesmith.kernels.attention import VARLEN_ATTENTION
from tunesmith.kernels.linear_ce import (
    chunked_linear_cross_entropy,
    linear_cross_entropy_reference,
)
from tunesmith.kernels.token_weights import TokenLoss, row_losses_reference
from tunesmith.models.loader import split_causal_lm
from tunesmith.train.vision_forward import language_uses, packed_vision_hidden


class Objective(Protocol):
    def loss_sum(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor: ...


def auto_chunk_rows(vocab: int, budget_bytes: int = 512 << 20) -> int:
    """Largest power of two of rows whose fp32 logits fit the budget (at least 64)."""
    rows = max(64, budget_bytes // (4 * vocab))
    return 1 << (rows.bit_length() - 1)


def trunk_inputs(batch: Batch, trunk: torch.nn.Module | None = None) -> dict:
    """Keyword inputs of the decoder trunk for a batch: padded batches pass their attention
    mask; packed (padding-free) batches pass restarting position ids and the segment
    boundaries that varlen attention reads (transformers forwards them to it). Packed
    batches on any other attention (sdpa, eager: the reference path) also pass the
    block-diagonal causal mask, so samples never attend to each other."""
    cu = getattr(batch, "cu_seqlens", None)
    if cu is None:
        # no padding at all: no mask, so attention takes its plain causal path
        dense = batch.n_tokens == batch.input_ids.numel()
        return with_vision({"attention_mask": None if dense else batch.attention_mask}, batch)
    inputs = {"position_ids": batch.position_ids, "cu_seq_lens_q": cu, "cu_seq_lens_k": cu,
              "max_length_q": batch.max_seqlen, "max_length_k": batch.max_seqlen}
    impl = getattr(getattr(trunk, "config", None), "_attn_implementation", "sdpa")
    if impl != VARLEN_ATTENTION and batch.segment_ids is not None \
            and not one_sample_per_row(batch):
        dtype = next(trunk.parameters()).dtype if trunk is not None else torch.float32
        inputs["attention_mask"] = packed_attention_mask(
            batch.segment_ids, dtype if impl == "eager" else None)
    return with_vision(inputs, batch)


def one_sample_per_row(batch: Batch) -> bool:
    """Every packed row holds exactly one sample and no padding (one long sample per row):
    plain causal attention is then exact, so no [B, 1, T, T] mask is built (at 131,072
    tokens that mask alone is 17 GB). Padding forms a segment of its own, so the count of
    segments equals the count of rows only in that case (shapes only: no device sync)."""
    return batch.cu_seqlens.numel() - 1 == batch.input_ids.shape[0]


VISION_KEYS = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw")


def packed_varlen_vision(batch: Batch, trunk: torch.nn.Module) -> bool:
    """A packed vision-language batch whose language model runs varlen attention."""
    return (getattr(batch, "mrope_position_ids", None) is not None
            and getattr(batch, "cu_seqlens", None) is not None
            and language_uses(trunk, VARLEN_ATTENTION))


def varlen_vision_inputs(batch: Batch) -> dict:
    cu = batch.cu_seqlens
    inputs = {"position_ids": torch.cat([batch.position_ids[None], batch.mrope_position_ids]),
              "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": batch.max_seqlen,
              "max_length_k": batch.max_seqlen}
    inputs.update({k: getattr(batch, k) for k in VISION_KEYS if getattr(batch, k) is not None})
    return inputs


def with_vision(inputs: dict, batch: Batch) -> dict:
    """Add a vision-language batch's pixels, grids and 3-D rotary positions. Packed rows
    put their restarting text positions first ([4, B, T], transformers' convention for
    packed mrope inputs). The varlen keys are dropped: the vision tower would receive them
    too and they describe the text rows, not the patches."""
    mrope = getattr(batch, "mrope_position_ids", None)
    if mrope is None:
        return inputs
    text = inputs.get("position_ids")
    inputs["position_ids"] = mrope if text is None else torch.cat([text[None], mrope])
    for key in ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k"):
        inputs.pop(key, None)
    inputs.update({k: getattr(batch, k) for k in VISION_KEYS if getattr(batch, k) is not None})
    return inputs


class NextTokenObjective:
    """Cross-entropy on the trained next tokens (SFT: assistant tokens; pt: all tokens),
    computed from hidden states so the full logits are never materialised."""

    def __init__(self, loss_impl: str = "chunked", chunk_size: int = 0,
                 token_loss: TokenLoss | None = None):
        self.loss_impl, self.chunk_size = loss_impl, chunk_size
        self.token_loss = token_loss or TokenLoss()  # DFT / EAFT / label smoothing

    def loss_sum(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        rows, head = self.target_rows(model, batch)
        return self.rows_loss(rows, head, batch)

    @staticmethod
    def target_rows(model: torch.nn.Module, batch: Batch
                    ) -> tuple[torch.Tensor, torch.nn.Module]:
        """Final hidden states of the rows that have a target [K, H], and the output head."""
        trunk, head = split_causal_lm(model)
        if packed_varlen_vision(batch, trunk):
            hidden = packed_vision_hidden(trunk, batch.input_ids, varlen_vision_inputs(batch))
        else:
            out = trunk(input_ids=batch.input_ids, use_cache=False, **trunk_inputs(batch, trunk))
            hidden = out.last_hidden_state  # [B, T, H]
        return hidden.reshape(-1, hidden.shape[-1]).index_select(0, batch.target_index), head

    def rows_loss(self, rows: torch.Tensor, head: torch.nn.Module, batch: Batch
                  ) -> torch.Tensor:
        """Summed loss of the target rows [K, H] through `head`."""
        if getattr(head, "bias", None) is not None:  # rare; the plain path handles the bias
            logits = head(rows).float()
            return row_losses_reference(logits, batch.target_ids, self.token_loss).sum()
        if self.loss_impl == "reference":
            return linear_cross_entropy_reference(rows, head.weight, batch.target_ids,
                                                  self.token_loss)
        chunk = self.chunk_size or auto_chunk_rows(head.weight.shape[0])
        return chunked_linear_cross_entropy(rows, head.weight, batch.target_ids, chunk,
                                            self.token_loss)


def packed_attention_mask(segment_ids: torch.Tensor, dtype: torch.dtype | None = None
                          ) -> torch.Tensor:
    """Block-diagonal causal mask of packed rows: True (or 0.0) where a query may attend.

    segment_ids: [B, T] (1..k per sample, 0 on padding, which attends only to padding).
    Returns [B, 1, T, T]: boolean (what sdpa takes) when `dtype` is None, else additive in
    `dtype` (0 / most negative; what eager attention adds to its scores). This is the
    reference path; a varlen attention kernel uses the batch's cu_seqlens instead.
    """
    t = segment_ids.shape[1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # [B, T, T]
    causal = torch.ones(t, t, dtype=torch.bool, device=segment_ids.device).tril()
    allowed = same & causal
    if dtype is None:
        return allowed[:, None]  # [B, 1, T, T]
    mask = torch.zeros(allowed.shape, dtype=dtype, device=segment_ids.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None]  # [B, 1, T, T]
