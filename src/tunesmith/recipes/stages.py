"""Stage name -> recipe. Every stage but ppo trains through the one recipe and loop (sft.py);
ppo generates rollouts between optimizer steps in its own loop (recipes/ppo.py)."""

from __future__ import annotations

from typing import Any

from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError
from tunesmith.recipes.ppo import run_ppo
from tunesmith.recipes.preference import preference_stage
from tunesmith.recipes.sft import run_sft


def run_stage(cfg: Config) -> dict[str, Any]:
    stage = cfg.finetuning.stage
    if stage in ("sft", "pt"):
        return run_sft(cfg)
    if stage in ("dpo", "kto", "rm"):
        return run_sft(cfg, preference_stage)
    if stage == "ppo":  # rollouts between optimizer steps: its own short loop
        return run_ppo(cfg)
    raise ConfigError(f"stage: {stage!r} is not one of sft, pt, dpo, kto, rm, ppo")
