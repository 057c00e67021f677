"""AdamW and learning-rate schedules with warmup."""

from __future__ import annotations

import math

import torch

from tunesmith.config.schema import TrainingConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainingConfig) -> torch.optim.Optimizer:
    """AdamW; no weight decay on biases and norms (1-D tensors). Fused on CUDA."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    groups = [g for g in groups if g["params"]]
    on_cuda = any(p.is_cuda for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1,
                             cfg.adam_beta2), eps=cfg.adam_epsilon, fused=on_cuda or None)


def warmup_steps(cfg: TrainingConfig, total_steps: int) -> int:
    return cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total_steps)


def lr_factor(step: int, kind: str, warmup: int, total: int) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based)."""
    if warmup and step < warmup:
        return (step + 1) / (warmup + 1)
    if kind in ("constant", "constant_with_warmup"):
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    progress = min(max(progress, 0.0), 1.0)
    if kind == "linear":
        return 1.0 - progress
    return 0.5 * (1.0 + math.cos(math.pi * progress))  # cosine


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainingConfig, total_steps: int
                    ) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = warmup_steps(cfg, total_steps)
    kind = cfg.lr_scheduler_type
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, kind, warmup, total_steps))
