"""`optim` names (HF Trainer's) -> optimizer constructors over parameter groups."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from tunesmith.config.schema import TrainingConfig
from tunesmith.errors import ConfigError


def require(module: str, extra: str, key: str) -> ModuleType:
    """Import an optional package, or fail naming the key and the extra that installs it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ConfigError(f"{key}: needs the {module} package, which is not installed "
                          f"({exc}); pip install 'tunesmith[{extra}]'") from None


def _adamw(groups: list[dict], cfg: TrainingConfig, fused: bool | None) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, lr=cfg.learning_rate, betas=(cfg.adam_beta1,
                             cfg.adam_beta2), eps=cfg.adam_epsilon, fused=fused)


def _on_cuda(groups: list[dict]) -> bool:
    return any(p.is_cuda for g in groups for p in g["params"])


def _bnb(name: str) -> Callable[[list[dict], TrainingConfig], torch.optim.Optimizer]:
    def build(groups: list[dict], cfg: TrainingConfig) -> torch.optim.Optimizer:
        bnb = require("bitsandbytes", "bitsandbytes", "optim")
        return getattr(bnb.optim, name)(groups, lr=cfg.learning_rate,
                                        betas=(cfg.adam_beta1, cfg.adam_beta2),
                                        eps=cfg.adam_epsilon)
    return build


def _adafactor(groups: list[dict], cfg: TrainingConfig) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    # HF Trainer's optim=adafactor: a fixed learning rate, no parameter scaling
    return Adafactor(groups, lr=cfg.learning_rate, scale_parameter=False, relative_step=False)


OPTIMIZERS: dict[str, Callable[[list[dict], TrainingConfig], Any]] = {
    "adamw_torch": lambda g, c: _adamw(g, c, _on_cuda(g) or None),
    "adamw_torch_fused": lambda g, c: _adamw(g, c, True),
    "adamw_8bit": _bnb("AdamW8bit"),
    "adamw_bnb_8bit": _bnb("AdamW8bit"),
    "paged_adamw_8bit": _bnb("PagedAdamW8bit"),
    "paged_adamw": _bnb("PagedAdamW"),
    "paged_adamw_32bit": _bnb("PagedAdamW32bit"),
    "adafactor": _adafactor,
    "sgd": lambda g, c: torch.optim.SGD(g, lr=c.learning_rate),
    "adagrad": lambda g, c: torch.optim.Adagrad(g, lr=c.learning_rate, eps=c.adam_epsilon),
    "rmsprop": lambda g, c: torch.optim.RMSprop(g, lr=c.learning_rate, eps=c.adam_epsilon),
}


def build_named(name: str, groups: list[dict], cfg: TrainingConfig) -> torch.optim.Optimizer:
    if name not in OPTIMIZERS:
        raise ConfigError(f"optim: {name!r} is not one of {', '.join(OPTIMIZERS)}")
    return OPTIMIZERS[name](groups, cfg)
