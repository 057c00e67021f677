"""Learning-rate schedules with warmup (HF Trainer's names and meanings)."""

from __future__ import annotations

import math

import torch

from tunesmith.config.schema import TrainingConfig
from tunesmith.errors import ConfigError

SCHEDULE_KWARGS = {"num_cycles", "min_lr_rate"}


def warmup_steps(cfg: TrainingConfig, total_steps: int) -> int:
    return cfg.warmup_steps or math.ceil(cfg.warmup_ratio * total_steps)


def lr_factor(step: int, kind: str, warmup: int, total: int, num_cycles: float = 0.5,
              min_lr_rate: float = 0.0) -> float:
    """Multiplier of the peak learning rate at optimizer step `step` (0-based).

    `num_cycles`: half-waves of the cosine (0.5: one descent to the floor); `min_lr_rate`:
    the floor of cosine and linear decay as a share of the peak."""
    if warmup and step < warmup:
        return (step + 1) / (warmup + 1)
    if kind in ("constant", "constant_with_warmup"):
        return 1.0
    progress = (step - warmup) / max(1, total - warmup)
    progress = min(max(progress, 0.0), 1.0)
    if kind == "linear":
        decay = 1.0 - progress
    else:  # cosine
        decay = 0.5 * (1.0 + math.cos(math.pi * 2.0 * num_cycles * progress))
    return min_lr_rate + (1.0 - min_lr_rate) * decay


def schedule_options(kwargs: dict) -> dict[str, float]:
    """lr_scheduler_kwargs checked: known names, numbers in range."""
    unknown = sorted(set(kwargs) - SCHEDULE_KWARGS)
    if unknown:
        raise ConfigError(f"lr_scheduler_kwargs: {', '.join(unknown)} not understood; known: "
                          f"{', '.join(sorted(SCHEDULE_KWARGS))}")
    out: dict[str, float] = {}
    for key, value in kwargs.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"lr_scheduler_kwargs: {key}: expected a number, got {value!r}")
        out[key] = float(value)
    if not 0.0 <= out.get("min_lr_rate", 0.0) < 1.0:
        raise ConfigError(f"lr_scheduler_kwargs: min_lr_rate {out['min_lr_rate']} must be in "
                          "[0, 1)")
    return out


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainingConfig, total_steps: int,
                    kwargs: dict | None = None) -> torch.optim.lr_scheduler.LambdaLR:
    warmup = warmup_steps(cfg, total_steps)
    kind = cfg.lr_scheduler_type
    options = schedule_options(kwargs or {})
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, kind, warmup, total_steps, **options))
