"""Optimizers and learning-rate schedules, chosen from the config by a small table.

    use_galore | use_apollo | use_badam | use_adam_mini | use_muon   (one family at most)
    else optim name (table.py) over weight-decay groups (groups.py), or LoRA+ groups
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from tunesmith.config.optim_keys import OptimConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.errors import ConfigError
from tunesmith.train.optim.families import build_adam_mini, build_badam, build_muon
from tunesmith.train.optim.groups import decay_groups, loraplus_groups, trainable_named
from tunesmith.train.optim.lowrank import build_apollo, build_galore
from tunesmith.train.optim.schedule import build_scheduler, lr_factor, warmup_steps
from tunesmith.train.optim.table import build_named

__all__ = ["build_optimizer", "build_scheduler", "lr_factor", "warmup_steps"]

Family = Callable[[torch.nn.Module, TrainingConfig, OptimConfig], torch.optim.Optimizer]
FAMILIES: dict[str, Family] = {"use_galore": build_galore, "use_apollo": build_apollo,
                               "use_badam": build_badam, "use_adam_mini": build_adam_mini,
                               "use_muon": build_muon}


def build_optimizer(model: torch.nn.Module, cfg: TrainingConfig,
                    ocfg: OptimConfig | None = None) -> torch.optim.Optimizer:
    """The optimizer the config names over the model's trainable parameters."""
    ocfg = ocfg or OptimConfig()
    chosen = [key for key in FAMILIES if getattr(ocfg, key)]
    if len(chosen) > 1:
        raise ConfigError(f"{', '.join(chosen)}: choose one optimizer family")
    if chosen and ocfg.loraplus_lr_ratio:
        raise ConfigError(f"loraplus_lr_ratio: cannot be combined with {chosen[0]}")
    if chosen:
        return FAMILIES[chosen[0]](model, cfg, ocfg)
    if ocfg.loraplus_lr_ratio:
        groups = loraplus_groups(model, cfg, ocfg)
    else:
        groups = decay_groups([p for _, p in trainable_named(model)], cfg.weight_decay)
    return build_named(ocfg.optim, groups, cfg, ocfg.optim_args)
