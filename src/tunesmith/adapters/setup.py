"""Make the right parameters trainable: LoRA through PEFT, freeze (last N layers), full."""

from __future__ import annotations

import logging
import re

import torch

from tunesmith.adapters.vision import VisionParts, freeze_parts, lora_targets
from tunesmith.config.schema import FinetuningConfig
from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)


def linear_module_names(model: torch.nn.Module) -> list[str]:
    """Short names of every nn.Linear inside the decoder layers (the output head excluded)."""
    names: set[str] = set()
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    for full_name, module in model.named_modules():
        if isinstance(module, torch.nn.Linear) and module is not head:
            names.add(full_name.rsplit(".", 1)[-1])
    return sorted(names)


def apply_lora(model: torch.nn.Module, cfg: FinetuningConfig,
               vision: VisionParts | None = None) -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    available = linear_module_names(model)
    targets = available if cfg.lora_target in (["all"], []) else cfg.lora_target
    missing = [t for t in targets if t not in available]
    if vision is not None and not missing:  # full names inside the unfrozen parts only
        targets = lora_targets(model, vision, cfg.lora_target)
    if missing:
        raise ConfigError(f"lora_target: {', '.join(missing)} not found in the model; its linear "
                          f"modules are {', '.join(available)} (or use all)")
    peft_cfg = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha or 2 * cfg.lora_rank,
                          lora_dropout=cfg.lora_dropout, target_modules=targets,
                          use_rslora=cfg.use_rslora, use_dora=cfg.use_dora,
                          task_type="CAUSAL_LM", bias="none")
    return get_peft_model(model, peft_cfg)


def load_adapters(model: torch.nn.Module, paths: list[str], *, trainable: bool
                  ) -> torch.nn.Module:
    """Stack saved PEFT adapters; with `trainable` the last one keeps training (resume/extend),
    otherwise all are merged into the weights for inference."""
    from peft import PeftModel

    for i, path in enumerate(paths):
        last = i == len(paths) - 1
        model = PeftModel.from_pretrained(model, path, is_trainable=trainable and last)
        if not (trainable and last):
            model = model.merge_and_unload()
    return model


def apply_freeze(model: torch.nn.Module, cfg: FinetuningConfig) -> torch.nn.Module:
    layers = _decoder_layer_count(model)
    n = cfg.freeze_trainable_layers
    if n == 0 or abs(n) > layers:
        raise ConfigError(f"freeze_trainable_layers: {n} must be non-zero and at most the "
                          f"model's {layers} layers in size")
    chosen = set(range(layers - n, layers)) if n > 0 else set(range(-n))
    modules = cfg.freeze_trainable_modules
    pattern = re.compile(r"\.layers\.(\d+)\.")
    for name, p in model.named_parameters():
        m = pattern.search(name)
        in_layer = m is not None and int(m.group(1)) in chosen
        p.requires_grad_(in_layer and (modules == ["all"] or any(f".{x}." in name or
                                                                 name.endswith(f".{x}")
                                                                 for x in modules)))
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError(f"freeze_trainable_modules: {modules} matched no parameter in the "
                          "trainable layers")
    return model


def _decoder_layer_count(model: torch.nn.Module) -> int:
    n = getattr(model.config, "num_hidden_layers", None)
    if not n:
        raise ConfigError("finetuning_type freeze needs config.num_hidden_layers on the model")
    return int(n)


def prepare_trainable(model: torch.nn.Module, cfg: FinetuningConfig,
                      adapter_paths: list[str], vision: VisionParts | None = None
                      ) -> torch.nn.Module:
    """Apply the finetuning_type (and, for a vision-language model, its frozen parts);
    trainable parameters are kept in fp32."""
    if cfg.finetuning_type == "lora":
        if adapter_paths:
            model = load_adapters(model, adapter_paths, trainable=True)
        else:
            model = apply_lora(model, cfg, vision)
    else:
        if adapter_paths:
            model = load_adapters(model, adapter_paths, trainable=False)
        if cfg.finetuning_type == "freeze":
            model = apply_freeze(model, cfg)
        else:
            for p in model.parameters():
                p.requires_grad_(True)
    if vision is not None:
        freeze_parts(model, vision)
    for p in model.parameters():
        if p.requires_grad and p.dtype != torch.float32:
            p.data = p.data.float()
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    total = sum(p.numel() for p in model.parameters())
    log.info("trainable parameters: %s of %s (%.2f%%)", f"{trainable:,}", f"{total:,}",
             100 * trainable / max(total, 1))
    return model
