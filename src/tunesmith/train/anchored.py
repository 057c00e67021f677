"""ASFT (use_asft_loss): the DFT loss plus asft_alpha x KL(reference || policy) per trained
token, the reference being a frozen copy of the model as training starts (LLaMA-Factory
loads the base model once more for it)."""

from __future__ import annotations

import copy

import torch

from tunesmith.data.batching import Batch
from tunesmith.kernels.anchored_kl import anchored_kl_reference, chunked_anchored_kl
from tunesmith.kernels.token_weights import TokenLoss
from tunesmith.train.objective import NextTokenObjective, auto_chunk_rows


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    ref = copy.deepcopy(model).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


class AnchoredObjective(NextTokenObjective):
    def __init__(self, reference: torch.nn.Module, alpha: float, loss_impl: str = "chunked",
                 chunk_size: int = 0, smoothing: float = 0.0):
        super().__init__(loss_impl, chunk_size, TokenLoss("dft", smoothing=smoothing))
        self.reference, self.alpha = reference, alpha

    def loss_sum(self, model: torch.nn.Module, batch: Batch) -> torch.Tensor:
        rows, head = self.target_rows(model, batch)  # [K, H]
        dft = self.rows_loss(rows, head, batch)
        with torch.no_grad():
            ref_rows, ref_head = self.target_rows(self.reference, batch)
        weight, ref_weight = head.weight, ref_head.weight  # [V, H]
        if self.loss_impl == "reference":
            kl = anchored_kl_reference(rows, weight, ref_rows, ref_weight)
        else:
            chunk = self.chunk_size or auto_chunk_rows(weight.shape[0])
            kl = chunked_anchored_kl(rows, weight, ref_rows, ref_weight, chunk)
        return dft + self.alpha * kl
