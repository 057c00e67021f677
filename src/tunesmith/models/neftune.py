"""NEFTune (Jain et al. 2023): uniform noise on the input embeddings while training,
scaled by alpha / sqrt(sequence length x hidden size), through a forward hook on the
embedding module (no class is patched; evaluation and generation see no noise)."""

from __future__ import annotations

import math

import torch


def add_neftune(model: torch.nn.Module, alpha: float) -> torch.utils.hooks.RemovableHandle:
    embed = model.get_input_embeddings()

    def noisy(module: torch.nn.Module, _inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        if not module.training:
            return output
        magnitude = alpha / math.sqrt(output.shape[-2] * output.shape[-1])  # [B, T, H]
        return output + torch.zeros_like(output).uniform_(-magnitude, magnitude)

    return embed.register_forward_hook(noisy)
