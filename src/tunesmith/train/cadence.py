"""When the loop evaluates: `eval_strategy` steps (every `eval_steps`) or epoch (at every
epoch end), never with no; the run's end adds one evaluation unless its last step had one."""

from __future__ import annotations

from tunesmith.config.schema import TrainingConfig


def evaluation_due(cfg: TrainingConfig, step: int, epoch_ended: bool) -> bool:
    """Whether to evaluate after optimizer step `step` (1-based)."""
    if cfg.eval_strategy == "epoch":
        return epoch_ended
    if cfg.eval_strategy == "steps":
        return bool(cfg.eval_steps) and step % cfg.eval_steps == 0
    return False


def final_evaluation_due(cfg: TrainingConfig, step: int, last_eval_step: int | None) -> bool:
    """Whether the run's end evaluates (not twice at the same step)."""
    return cfg.eval_strategy != "no" and last_eval_step != step
