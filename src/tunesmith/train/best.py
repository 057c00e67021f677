"""The best evaluation so far: metric_for_best_model / greater_is_better, early stopping
(early_stopping_steps: evaluations without improvement) and load_best_model_at_end (the
trainable weights of the best evaluation are kept in CPU memory and restored at the end)."""

from __future__ import annotations

import logging

import torch

from tunesmith.config.run_keys import RunConfig
from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)
METRICS = ("loss", "eval_loss")  # what the loop's evaluation measures


class BestTracker:
    def __init__(self, model: torch.nn.Module, run: RunConfig, has_validation: bool,
                 sharded: bool):
        self.model, self.run = model, run
        wants_best = run.load_best_model_at_end or run.early_stopping_steps > 0
        if run.metric_for_best_model not in METRICS:
            raise ConfigError(f"metric_for_best_model: {run.metric_for_best_model!r} is not "
                              f"measured; tunesmith evaluates {', '.join(METRICS)}")
        if (wants_best or run.do_eval) and not has_validation:
            key = "do_eval" if run.do_eval and not wants_best else (
                "load_best_model_at_end" if run.load_best_model_at_end
                else "early_stopping_steps")
            raise ConfigError(f"{key}: needs validation data; set val_size (e.g. 0.1) or "
                              "eval_dataset")
        if run.load_best_model_at_end and sharded:
            raise ConfigError("load_best_model_at_end: not supported with FSDP or DeepSpeed "
                              "(the weights are sharded); use DDP or one process")
        self.best: float | None = None
        self.best_step = 0
        self.since_best = 0
        self._weights: dict[str, torch.Tensor] | None = None

    def _better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value > self.best if self.run.greater_is_better else value < self.best

    def observe(self, step: int, value: float) -> None:
        if self._better(value):
            self.best, self.best_step, self.since_best = value, step, 0
            if self.run.load_best_model_at_end:
                self._weights = {n: p.detach().to("cpu", copy=True)
                                 for n, p in self.model.named_parameters() if p.requires_grad}
        else:
            self.since_best += 1

    def stop_early(self) -> bool:
        patience = self.run.early_stopping_steps
        if patience and self.since_best >= patience:
            log.warning("early_stopping_steps: %d evaluations without improvement of %s "
                        "(best %.4f at step %d); stopping", self.since_best,
                        self.run.metric_for_best_model, self.best, self.best_step)
            return True
        return False

    @torch.no_grad()
    def restore_best(self) -> int | None:
        """Put the best evaluation's weights back; returns its step (None: nothing kept)."""
        if self._weights is None:
            return None
        for name, p in self.model.named_parameters():
            if name in self._weights:
                p.copy_(self._weights[name].to(p.device))
        log.info("load_best_model_at_end: restored the weights of step %d (%s %.4f)",
                 self.best_step, self.run.metric_for_best_model, self.best)
        return self.best_step
