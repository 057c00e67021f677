"""Stage name -> recipe. Every stage trains through the one recipe and loop (sft.py)."""

from __future__ import annotations

from typing import Any

from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError
from tunesmith.recipes.preference import preference_stage
from tunesmith.recipes.sft import run_sft


def run_stage(cfg: Config) -> dict[str, Any]:
    stage = cfg.finetuning.stage
    if stage in ("sft", "pt"):
        return run_sft(cfg)
    if stage in ("dpo", "kto", "rm"):
        return run_sft(cfg, preference_stage)
    raise ConfigError(f"stage: {stage!r} is not available yet (PPO with a reward model, GAE and "
                      "a KL penalty is planned); use dpo or kto to learn from preferences, or "
                      "rm to train a reward model")
