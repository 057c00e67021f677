"""Stages dpo, kto and rm: the SFT recipe with a preference objective.

    dpo: pairs -> DpoObjective (sigmoid | hinge | ipo | orpo | simpo, + pref_ftx)
    kto: labelled answers -> KtoObjective
    rm:  pairs -> value head on the model + RewardObjective; value_head.safetensors saved
The reference of dpo/kto: the base with adapters disabled (LoRA, no second copy), or
`ref_model` (+ `ref_model_adapters`), or for full/freeze runs a frozen copy of the base.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tunesmith.adapters.setup import load_adapters
from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError
from tunesmith.models.loader import load_causal_lm
from tunesmith.models.provision import resolve_model_path
from tunesmith.recipes.stage import StageParts
from tunesmith.train.objectives.kto import KtoSettings
from tunesmith.train.objectives.pairwise import DpoObjective, KtoObjective, RewardObjective
from tunesmith.train.objectives.precompute import precompute_reference
from tunesmith.train.objectives.preference import PairLossSettings
from tunesmith.train.objectives.reference import Reference
from tunesmith.train.objectives.reward import attach_value_head, save_value_head


def check_preference_config(cfg: Config) -> None:
    p, stage = cfg.preference, cfg.finetuning.stage
    problems = []
    if stage == "dpo" and p.dpo_label_smoothing and p.pref_loss != "sigmoid":
        problems.append(f"dpo_label_smoothing: {p.dpo_label_smoothing} applies to pref_loss "
                        f"sigmoid only, not {p.pref_loss!r}; set it to 0 or use sigmoid")
    if p.ref_model_adapters and not p.ref_model:
        problems.append("ref_model_adapters: set, but ref_model is empty; name the model the "
                        "adapters belong to in ref_model")
    if problems:
        raise ConfigError(problems)


def build_reference(cfg: Config, device: torch.device) -> Reference:
    p, m = cfg.preference, cfg.model
    if not p.ref_model and cfg.finetuning.finetuning_type == "lora":
        return Reference(None)  # the policy's base, adapters disabled
    path = resolve_model_path(p.ref_model or m.model_name_or_path, m.cache_dir or None)
    dtype = torch.bfloat16 if device.type == "cuda" and cfg.training.bf16 else torch.float32
    model = load_causal_lm(path, dtype=dtype, trust_remote_code=m.trust_remote_code,
                           attn_implementation="sdpa", device=device)
    if p.ref_model_adapters:
        model = load_adapters(model, p.ref_model_adapters, trainable=False)
    return Reference(model)


def preference_stage(cfg: Config, model: torch.nn.Module, device: torch.device,
                     pad_id: int) -> StageParts:
    check_preference_config(cfg)
    p, t, stage = cfg.preference, cfg.training, cfg.finetuning.stage
    kw = {"loss_impl": t.loss_impl, "chunk_size": t.loss_chunk_size}
    if stage == "rm":
        head = attach_value_head(model, model.config.hidden_size, t.seed)
        return StageParts(RewardObjective(**kw),
                          save_extra=lambda folder: save_value_head(head, Path(folder)))
    if stage == "kto":
        objective: Any = KtoObjective(KtoSettings(p.pref_beta, p.kto_chosen_weight,
                                                  p.kto_rejected_weight, p.pref_ftx),
                                      build_reference(cfg, device), **kw)
    else:
        settings = PairLossSettings(p.pref_loss, p.pref_beta, p.dpo_label_smoothing,
                                    p.simpo_gamma, p.pref_ftx)
        objective = DpoObjective(settings, build_reference(cfg, device)
                                 if settings.uses_reference else None, **kw)
    prepare = None
    if p.precompute_ref_log_probs and objective.reference is not None:
        def prepare(data: Any) -> None:
            def ref_fn(batch: Any) -> torch.Tensor:
                return objective.reference.logps(model, batch, objective.logps)

            bs = t.per_device_eval_batch_size
            data.train = precompute_reference(data.train, ref_fn, pad_id, bs, device)
            if len(data.val):
                data.val = precompute_reference(data.val, ref_fn, pad_id, bs, device)
    return StageParts(objective, prepare=prepare)
