"""Optimizer steps without a host sync.

A step's loss and gradient norm are needed on the host only to log them and to skip a step
whose loss or norm is not finite. Reading them right away (`float(loss)`) stops the host
until the GPU has finished the step, and the GPU then idles while the host prepares and
launches the next one (about 1-4% of a 7B LoRA step on an H200, bench/profile_step.py).

Here the skip is decided on the device instead: the fused torch optimizers take a
`found_inf` tensor (as under GradScaler) and leave weights, moments and step count untouched
when it is 1. The values are copied to pinned host memory without blocking and read one
step later, while the GPU runs the next step, or at once where the loop needs them (a log,
an evaluation, a checkpoint, a stop, the last step). A skipped step is then counted and
reported as before, and the learning-rate schedule is moved back one point; the step that
ran in between used the schedule's next value.

Used for single-process runs with a fused Adam/AdamW/SGD (the default on CUDA), without an
fp16 GradScaler, with tunesmith's LambdaLR schedule. Other runs read the values
every step (train/loop.py).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tunesmith.train.nonfinite import count_nonfinite

FOUND_INF_OPTIMIZERS = (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD)


def lagged_steps_apply(trainer: Any) -> bool:
    """Whether `trainer`'s steps can skip non-finite updates on the device."""
    opt = trainer.optimizer
    return (trainer.world == 1 and trainer.strategy.name == "single"
            and trainer.scaler is None
            and type(opt) in FOUND_INF_OPTIMIZERS and bool(opt.defaults.get("fused"))
            and type(trainer.scheduler) is torch.optim.lr_scheduler.LambdaLR)


class PendingStep:
    """One optimizer step's loss and grad norm on their way to the host."""

    def __init__(self, step: int, loss: torch.Tensor, norm: torch.Tensor):
        self.step = step
        values = torch.stack([loss.detach().float().reshape(()),
                              norm.detach().float().reshape(())])
        self.done: torch.cuda.Event | None = None
        if values.is_cuda:
            self.host = torch.empty(2, dtype=torch.float32, pin_memory=True)
            self.host.copy_(values, non_blocking=True)
            self.done = torch.cuda.Event()
            self.done.record()
        else:
            self.host = values

    def values(self) -> tuple[float, float]:
        """(loss, grad norm); waits for this step's work only, not for later steps'."""
        if self.done is not None:
            self.done.synchronize()
        loss, norm = self.host.tolist()
        return loss, norm


def step_on_device(trainer: Any, loss: torch.Tensor) -> PendingStep:
    """Clip, then step the optimizer unless the loss or the norm is non-finite (decided on
    the device), zero the gradients and advance the schedule; nothing waits for the GPU."""
    norm = trainer.strategy.clip(trainer.cfg.max_grad_norm)
    bad = (~torch.isfinite(loss + norm.to(loss.device))).float()
    opt = trainer.optimizer
    opt.found_inf = bad
    try:
        opt.step()
    finally:
        del opt.found_inf
    opt.zero_grad(set_to_none=True)
    trainer.scheduler.step()
    return PendingStep(trainer.state.step + 1, loss, norm)


def settle(trainer: Any, pending: PendingStep) -> tuple[float, float]:
    """Read a step's values; a non-finite one was not applied: count and report it (raising
    after too many in a row) and move the schedule back the point it advanced."""
    loss, norm = pending.values()
    if math.isfinite(loss) and math.isfinite(norm):
        trainer.state.nonfinite_run = 0
        return loss, norm
    scheduler = trainer.scheduler
    scheduler.last_epoch -= 2
    scheduler.step()  # recomputes the learning rates one point back
    count_nonfinite(trainer, loss, norm, step=pending.step)
    return loss, norm


def settle_ready(trainer: Any, pending: list[PendingStep], new: PendingStep, now: bool
                 ) -> list[tuple[float, float]]:
    """Queue `new` and read what is due: every queued step when `now`, else all but `new`
    (the GPU runs it while the host goes on). `pending` is updated in place."""
    pending.append(new)
    ready = pending[:] if now else pending[:-1]
    del pending[:len(ready)]
    return [settle(trainer, p) for p in ready]
