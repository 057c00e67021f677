"""Parameter groups: weight decay on matrices only, and LoRA+'s learning-rate ratios."""

from __future__ import annotations

import torch

from tunesmith.config.optim_keys import OptimConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.errors import ConfigError


def trainable_named(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if p.requires_grad]


def decay_groups(params: list[torch.nn.Parameter], weight_decay: float) -> list[dict]:
    """No weight decay on biases and norms (1-D tensors)."""
    decay = [p for p in params if p.ndim >= 2]
    no_decay = [p for p in params if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def loraplus_groups(model: torch.nn.Module, cfg: TrainingConfig, ocfg: OptimConfig
                    ) -> list[dict]:
    """LoRA+ (Hayou et al. 2024), as LLaMA-Factory groups it: B matrices (and 1-D
    parameters) at learning_rate x loraplus_lr_ratio, A matrices at learning_rate, LoRA on
    embeddings at loraplus_lr_embedding."""
    named = trainable_named(model)
    if not any("lora_" in n for n, _ in named):
        raise ConfigError("loraplus_lr_ratio: needs finetuning_type lora (the model has no "
                          "trainable LoRA matrices)")
    lr, ratio = cfg.learning_rate, ocfg.loraplus_lr_ratio
    buckets: dict[str, list] = {"a": [], "b": [], "b_nodecay": [], "embedding": []}
    for name, p in named:
        if "lora_embedding_B" in name:
            buckets["embedding"].append(p)
        elif "lora_B" in name or p.ndim == 1:
            buckets["b" if p.ndim >= 2 else "b_nodecay"].append(p)
        else:
            buckets["a"].append(p)
    wd = cfg.weight_decay
    groups = [{"params": buckets["a"], "lr": lr, "weight_decay": wd},
              {"params": buckets["b"], "lr": lr * ratio, "weight_decay": wd},
              {"params": buckets["b_nodecay"], "lr": lr * ratio, "weight_decay": 0.0},
              {"params": buckets["embedding"], "lr": ocfg.loraplus_lr_embedding,
               "weight_decay": wd}]
    return [g for g in groups if g["params"]]


def lowrank_target_params(model: torch.nn.Module, targets: list[str], key: str
                          ) -> list[torch.nn.Parameter]:
    """Trainable 2-D weights of the linear modules named by `targets` (all: every linear
    module but the output head), for GaLore / APOLLO projection."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    chosen: list[torch.nn.Parameter] = []
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear) or module is head:
            continue
        if targets != ["all"] and not any(t in name for t in targets):
            continue
        chosen += [p for p in module.parameters() if p.requires_grad and p.ndim > 1]
    if not chosen:
        raise ConfigError(f"{key}: {','.join(targets)} matched no trainable linear weight; "
                          "use all or module names such as q_proj,v_proj")
    return chosen
