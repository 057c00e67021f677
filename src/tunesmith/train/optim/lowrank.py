"""GaLore and APOLLO: AdamW variants that keep optimizer state in a low-rank projection of
each targeted weight's gradient (galore-torch / apollo-torch packages, optional extras)."""

from __future__ import annotations

import logging

import torch

from tunesmith.config.optim_keys import OptimConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.errors import ConfigError
from tunesmith.train.optim.groups import decay_groups, lowrank_target_params, trainable_named
from tunesmith.train.optim.table import require

log = logging.getLogger(__name__)

GALORE_CLASSES = {"adamw_torch": "GaLoreAdamW", "adamw_torch_fused": "GaLoreAdamW",
                  "adamw_8bit": "GaLoreAdamW8bit", "adamw_bnb_8bit": "GaLoreAdamW8bit",
                  "paged_adamw_8bit": "GaLoreAdamW8bit", "adafactor": "GaLoreAdafactor"}


def _split(model: torch.nn.Module, targets: list[str], key: str, cfg: TrainingConfig
           ) -> tuple[list[torch.nn.Parameter], list[dict]]:
    projected = lowrank_target_params(model, targets, key)
    ids = {id(p) for p in projected}
    rest = [p for _, p in trainable_named(model) if id(p) not in ids]
    return projected, decay_groups(rest, cfg.weight_decay)


def _warn_layerwise(key: str, cfg: TrainingConfig) -> None:
    if cfg.gradient_accumulation_steps != 1:
        raise ConfigError(f"{key}: layer-wise updates do not support gradient accumulation "
                          f"(gradient_accumulation_steps is {cfg.gradient_accumulation_steps});"
                          f" set it to 1 or {key}: false")
    log.warning("%s: tunesmith applies the same update once per step instead of inside "
                "backward; results match, the gradient-memory saving does not apply", key)


def build_galore(model: torch.nn.Module, cfg: TrainingConfig, ocfg: OptimConfig
                 ) -> torch.optim.Optimizer:
    if ocfg.optim not in GALORE_CLASSES:
        raise ConfigError(f"use_galore: works with optim {', '.join(GALORE_CLASSES)}; got "
                          f"{ocfg.optim!r}")
    galore = require("galore_torch", "galore", "use_galore")
    if ocfg.galore_layerwise:
        _warn_layerwise("galore_layerwise", cfg)
    projected, groups = _split(model, ocfg.galore_target, "galore_target", cfg)
    groups.append({"params": projected, "weight_decay": cfg.weight_decay,
                   "rank": ocfg.galore_rank, "update_proj_gap": ocfg.galore_update_interval,
                   "scale": ocfg.galore_scale, "proj_type": ocfg.galore_proj_type})
    cls = getattr(galore, GALORE_CLASSES[ocfg.optim])
    if cls.__name__ == "Adafactor":
        return cls(groups, lr=cfg.learning_rate, scale_parameter=False, relative_step=False)
    return cls(groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1, cfg.adam_beta2),
               eps=cfg.adam_epsilon)


def build_apollo(model: torch.nn.Module, cfg: TrainingConfig, ocfg: OptimConfig
                 ) -> torch.optim.Optimizer:
    if ocfg.optim not in ("adamw_torch", "adamw_torch_fused"):
        raise ConfigError(f"use_apollo: works with optim adamw_torch; got {ocfg.optim!r}")
    apollo = require("apollo_torch", "apollo", "use_apollo")
    if ocfg.apollo_layerwise:
        _warn_layerwise("apollo_layerwise", cfg)
    projected, groups = _split(model, ocfg.apollo_target, "apollo_target", cfg)
    groups.append({"params": projected, "weight_decay": cfg.weight_decay,
                   "rank": ocfg.apollo_rank, "proj": ocfg.apollo_proj,
                   "update_proj_gap": ocfg.apollo_update_interval, "scale": ocfg.apollo_scale,
                   "proj_type": ocfg.apollo_proj_type, "scale_type": ocfg.apollo_scale_type})
    return apollo.APOLLOAdamW(groups, lr=cfg.learning_rate,
                              betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                              scale_front=ocfg.apollo_scale_front)
