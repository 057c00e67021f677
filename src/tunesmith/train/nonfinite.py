"""Non-finite steps: an optimizer step whose loss or gradient norm is not finite is skipped
(weights never see NaN), reported with its place, and counted; too many in a row end the run
naming the last good checkpoint."""

from __future__ import annotations

import logging
from typing import Any

from tunesmith.errors import TrainingError
from tunesmith.runs.folder import latest_checkpoint

log = logging.getLogger(__name__)


def count_nonfinite(trainer: Any, loss: float, norm: float, step: int | None = None) -> None:
    """Record a skipped step (`step`, default the one under way) on `trainer` (its state,
    metrics and limit); raise after `max_nonfinite_steps` in a row."""
    s = trainer.state
    step = step if step is not None else s.step + 1
    s.nonfinite_total += 1
    s.nonfinite_run += 1
    if trainer.ctx.is_main:
        log.warning("step %d: non-finite loss %s / grad norm %s; optimizer step skipped "
                    "(%d in a row, %d in all)", step, loss, norm, s.nonfinite_run,
                    s.nonfinite_total)
        trainer._write_metrics({"step": step, "skipped_nonfinite": True,
                                "loss_raw": loss, "grad_norm_raw": norm})
    if s.nonfinite_run >= trainer.cfg.max_nonfinite_steps:
        last = latest_checkpoint(trainer.output_dir)
        keep = f"the last good checkpoint is {last}" if last else "no checkpoint was written"
        raise TrainingError(
            f"{s.nonfinite_run} optimizer steps in a row had a non-finite loss or gradient "
            f"(last at step {step}); stopping. Likely causes: fp16 overflow (use bf16 "
            "or a lower learning rate), a learning rate too high (lower learning_rate, add "
            f"warmup), or corrupt data. {keep}; weights were never updated with NaN.")
