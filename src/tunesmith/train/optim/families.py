"""Muon (torch.optim.Muon), Adam-mini and BAdam: optimizers that need the model's
structure, not only a list of parameters."""

from __future__ import annotations

import torch

from tunesmith.config.optim_keys import OptimConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.errors import ConfigError
from tunesmith.train.optim.composite import CompositeOptimizer
from tunesmith.train.optim.groups import decay_groups, trainable_named
from tunesmith.train.optim.table import build_named, require


def muon_split(model: torch.nn.Module) -> tuple[list[torch.nn.Parameter], list]:
    """(2-D weights inside the decoder: Muon, everything else: AdamW). Embeddings and the
    output head stay with AdamW, as in Muon's and LLaMA-Factory's recipe."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    emb = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    skip = {id(p) for m in (head, emb) if m is not None for p in m.parameters()}
    matrices, rest = [], []
    for _, p in trainable_named(model):
        (matrices if p.ndim == 2 and id(p) not in skip else rest).append(p)
    return matrices, rest


def build_muon(model: torch.nn.Module, cfg: TrainingConfig, ocfg: OptimConfig
               ) -> torch.optim.Optimizer:
    muon_cls = getattr(torch.optim, "Muon", None)
    if muon_cls is None:
        raise ConfigError(f"use_muon: torch {torch.__version__} has no torch.optim.Muon "
                          "(added in torch 2.9); upgrade torch")
    matrices, rest = muon_split(model)
    if not matrices:
        raise ConfigError("use_muon: no trainable 2-D weight inside the decoder layers")
    # match_rms_adamw scales each update to AdamW's RMS, so learning_rate and weight_decay
    # keep their AdamW meaning (the Moonlight recipe LLaMA-Factory follows)
    parts = [muon_cls(matrices, lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                      adjust_lr_fn="match_rms_adamw")]
    if rest:
        parts.append(build_named("adamw_torch", decay_groups(rest, cfg.weight_decay), cfg))
    return CompositeOptimizer(parts)


def build_adam_mini(model: torch.nn.Module, cfg: TrainingConfig, ocfg: OptimConfig
                    ) -> torch.optim.Optimizer:
    mini = require("adam_mini", "adam-mini", "use_adam_mini")
    c = model.config
    return mini.Adam_mini(named_parameters=trainable_named(model), lr=cfg.learning_rate,
                          betas=(cfg.adam_beta1, cfg.adam_beta2), eps=cfg.adam_epsilon,
                          weight_decay=cfg.weight_decay, model_sharding=False,
                          dim=c.hidden_size, n_heads=c.num_attention_heads,
                          n_kv_heads=getattr(c, "num_key_value_heads", None), verbose=False)


def build_badam(model: torch.nn.Module, cfg: TrainingConfig, ocfg: OptimConfig
                ) -> torch.optim.Optimizer:
    if ocfg.badam_mode != "layer":
        raise ConfigError("badam_mode: ratio is not supported; use badam_mode: layer")
    badam = require("badam", "badam", "use_badam")
    named = trainable_named(model)
    base = build_named(ocfg.optim, decay_groups([p for _, p in named], cfg.weight_decay), cfg)
    start = None if ocfg.badam_start_block < 0 else ocfg.badam_start_block
    return badam.BlockOptimizer(
        base_optimizer=base, named_parameters_list=named, block_prefix_list=None,
        switch_block_every=ocfg.badam_switch_interval, start_block=start,
        switch_mode=ocfg.badam_switch_mode, verbose=ocfg.badam_verbose)
