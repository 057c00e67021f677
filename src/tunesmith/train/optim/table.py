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


def _adamw(groups: list[dict], cfg: TrainingConfig, fused: bool | None, **extra: Any
           ) -> torch.optim.Optimizer:
    return torch.optim.AdamW(groups, **{"lr": cfg.learning_rate, "betas": (
        cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_epsilon, "fused": fused, **extra})


def _on_cuda(groups: list[dict]) -> bool:
    return any(p.is_cuda for g in groups for p in g["params"])


def _bnb(name: str) -> Callable[..., torch.optim.Optimizer]:
    def build(groups: list[dict], cfg: TrainingConfig, **extra: Any) -> torch.optim.Optimizer:
        bnb = require("bitsandbytes", "bitsandbytes", "optim")
        return getattr(bnb.optim, name)(groups, **{"lr": cfg.learning_rate, "betas": (
            cfg.adam_beta1, cfg.adam_beta2), "eps": cfg.adam_epsilon, **extra})
    return build


def _adafactor(groups: list[dict], cfg: TrainingConfig, **extra: Any) -> torch.optim.Optimizer:
    from transformers.optimization import Adafactor

    # HF Trainer's optim=adafactor: a fixed learning rate, no parameter scaling
    return Adafactor(groups, **{"lr": cfg.learning_rate, "scale_parameter": False,
                                "relative_step": False, **extra})


OPTIMIZERS: dict[str, Callable[..., Any]] = {  # (groups, cfg, **optim_args)
    "adamw_torch": lambda g, c, **x: _adamw(g, c, _on_cuda(g) or None, **x),
    "adamw_torch_fused": lambda g, c, **x: _adamw(g, c, True, **x),
    "adamw_8bit": _bnb("AdamW8bit"),
    "adamw_bnb_8bit": _bnb("AdamW8bit"),
    "paged_adamw_8bit": _bnb("PagedAdamW8bit"),
    "paged_adamw": _bnb("PagedAdamW"),
    "paged_adamw_32bit": _bnb("PagedAdamW32bit"),
    "adafactor": _adafactor,
    "sgd": lambda g, c, **x: torch.optim.SGD(g, **{"lr": c.learning_rate, **x}),
    "adagrad": lambda g, c, **x: torch.optim.Adagrad(g, **{"lr": c.learning_rate,
                                                         "eps": c.adam_epsilon, **x}),
    "rmsprop": lambda g, c, **x: torch.optim.RMSprop(g, **{"lr": c.learning_rate,
                                                         "eps": c.adam_epsilon, **x}),
}


def parse_optim_args(text: str) -> dict[str, Any]:
    """optim_args "a=1,b=true" -> {"a": 1, "b": True} (YAML scalars)."""
    import yaml

    out: dict[str, Any] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ConfigError(f"optim_args: {item!r} is not key=value; write e.g. "
                              "momentum=0.9,nesterov=true")
        out[key.strip()] = yaml.safe_load(value.strip())
    return out


def build_named(name: str, groups: list[dict], cfg: TrainingConfig, optim_args: str = ""
                ) -> torch.optim.Optimizer:
    if name not in OPTIMIZERS:
        raise ConfigError(f"optim: {name!r} is not one of {', '.join(OPTIMIZERS)}")
    extra = parse_optim_args(optim_args)
    try:
        return OPTIMIZERS[name](groups, cfg, **extra)
    except (TypeError, ValueError) as exc:  # an unknown or invalid argument
        raise ConfigError(f"optim_args: {optim_args!r} rejected by {name}: {exc}") from None
