"""LLaMA-Factory's adapter variants: PiSSA init (and its conversion to plain LoRA), OFT,
extra trained modules (additional_target), a new adapter over merged ones, LLaMA Pro
block selection and freeze_extra_modules."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tunesmith.config.method_keys import MethodConfig
from tunesmith.config.schema import FinetuningConfig
from tunesmith.errors import ConfigError

PISSA_INIT_DIR = "pissa_init"
PISSA_CONVERTED_DIR = "pissa_converted"


def lora_extras(method: MethodConfig) -> dict[str, Any]:
    """LoraConfig arguments for PiSSA and additional_target."""
    extra: dict[str, Any] = {}
    if method.pissa_init:
        extra["init_lora_weights"] = ("pissa" if method.pissa_iter == -1
                                      else f"pissa_niter_{method.pissa_iter}")
    if method.additional_target:
        extra["modules_to_save"] = list(method.additional_target)
    return extra


def apply_oft(model: torch.nn.Module, targets: list[str], method: MethodConfig
              ) -> torch.nn.Module:
    """Orthogonal fine-tuning through PEFT's OFTConfig (one of oft_rank / oft_block_size)."""
    from peft import OFTConfig, get_peft_model

    if bool(method.oft_rank) == bool(method.oft_block_size):
        raise ConfigError(f"oft_rank / oft_block_size: set exactly one of them (got "
                          f"{method.oft_rank} and {method.oft_block_size}); the other is 0")
    peft_cfg = OFTConfig(r=method.oft_rank, oft_block_size=method.oft_block_size,
                         target_modules=targets, module_dropout=method.module_dropout,
                         modules_to_save=list(method.additional_target) or None,
                         task_type="CAUSAL_LM")
    return get_peft_model(model, peft_cfg)


def llama_pro_layers(num_layers: int, trainable_layers: int) -> set[int]:
    """LLaMA Pro: an expanded model has a new block after every `stride` layers; those
    (indices stride-1, 2*stride-1, ...) are the ones trained."""
    if trainable_layers <= 0 or num_layers % trainable_layers:
        raise ConfigError(f"use_llama_pro: freeze_trainable_layers ({trainable_layers}) must be "
                          f"positive and divide the model's {num_layers} layers (the number of "
                          "blocks the expansion inserted)")
    stride = num_layers // trainable_layers
    return set(range(stride - 1, num_layers, stride))


def extra_module_params(model: torch.nn.Module, names: list[str]
                        ) -> list[torch.nn.Parameter]:
    """Parameters of modules outside the decoder layers named by freeze_extra_modules."""
    chosen, found = [], set()
    for full, p in model.named_parameters():
        if ".layers." in full:
            continue
        for name in names:
            if f".{name}." in f".{full}":
                chosen.append(p)
                found.add(name)
    missing = [n for n in names if n not in found]
    if missing:
        outside = sorted({n.rsplit(".", 2)[-2] for n, _ in model.named_parameters()
                          if ".layers." not in n and "." in n})
        raise ConfigError(f"freeze_extra_modules: {', '.join(missing)} not found outside the "
                          f"decoder layers; choose among {', '.join(outside)}")
    return chosen


def save_pissa_init(model: torch.nn.Module, out: Path) -> None:
    """Keep the PiSSA adapter as initialised (saved as plain LoRA init), which PEFT needs
    to convert the trained adapter into a LoRA of the original base."""
    cfg = model.peft_config["default"]
    original = cfg.init_lora_weights
    cfg.init_lora_weights = True
    try:
        model.save_pretrained(str(out / PISSA_INIT_DIR))
    finally:
        cfg.init_lora_weights = original


def save_pissa_converted(model: torch.nn.Module, out: Path) -> None:
    model.save_pretrained(str(out / PISSA_CONVERTED_DIR),
                          path_initial_model_for_weight_conversion=str(out / PISSA_INIT_DIR))


def check_method(cfg: FinetuningConfig, method: MethodConfig) -> None:
    """Keys that belong to another finetuning_type fail instead of doing nothing."""
    kind = cfg.finetuning_type
    if method.pissa_init and kind != "lora":
        raise ConfigError(f"pissa_init: needs finetuning_type lora (got {kind})")
    if method.pissa_convert and not method.pissa_init:
        raise ConfigError("pissa_convert: needs pissa_init: true")
    if (method.use_llama_pro or method.freeze_extra_modules) and kind != "freeze":
        key = "use_llama_pro" if method.use_llama_pro else "freeze_extra_modules"
        raise ConfigError(f"{key}: needs finetuning_type freeze (got {kind})")
    if method.additional_target and kind not in ("lora", "oft"):
        raise ConfigError(f"additional_target: needs finetuning_type lora or oft (got {kind})")
    if method.create_new_adapter and kind not in ("lora", "oft"):
        raise ConfigError(f"create_new_adapter: needs finetuning_type lora or oft (got {kind})")
