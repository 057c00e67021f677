"""FLOP counts for MFU, written out so anyone can check them.

Per trained sequence of length s in a model with L layers, attention width d (heads x
head_dim) and N parameters in matrix multiplies (decoder linears + output head):

    full fine-tuning:   6 N s            (forward 2N, backward 4N: activations + weights)
    frozen base (LoRA/freeze): 4 N s     (forward 2N, backward 2N: activation gradients only)
    attention scores (causal, both matmuls QK^T and PV): forward 2 L d s^2,
                     backward 4 L d s^2  -> 6 L d s^2
Recomputation (gradient checkpointing) is not credited. LoRA's own small matrices are
ignored. The output head is counted for every position (an upper bound; the fused loss
skips untrained positions, so this slightly flatters runs with masked prompts).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class FlopModel:
    matmul_params: int
    layers: int
    attn_width: int
    full: bool

    def sequence_flops(self, length: int) -> float:
        dense = (6 if self.full else 4) * self.matmul_params * length
        return dense + 6 * self.layers * self.attn_width * length * length


def build_flop_model(model: torch.nn.Module, full: bool) -> FlopModel:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = base.config.get_text_config()  # a vision-language model: its language model
    matmul = 0
    for name, module in base.named_modules():
        # the vision tower runs per patch, not per token: left out of the per-token count
        if isinstance(module, torch.nn.Linear) and "lora_" not in name \
                and ".visual." not in f".{name}":
            matmul += module.weight.numel()
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    return FlopModel(matmul, cfg.num_hidden_layers, cfg.num_attention_heads * head_dim, full)


def batch_flops(flop_model: FlopModel, micro: list) -> float:
    """FLOPs of a list of batches, from each row's real (unpadded) length."""
    total = 0.0
    for b in micro:
        for length in b.lengths():
            total += flop_model.sequence_flops(length)
    return total
