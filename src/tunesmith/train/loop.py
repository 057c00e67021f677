"""The one training loop. Objectives, logging, evaluation and checkpoints plug into it.

    for each optimizer step:
        micro-batches <- next `gradient_accumulation_steps` batches of the epoch order
        n <- trained tokens of all those micro-batches
        for each micro-batch: backward(loss_sum / n)        # token-normalised over the step
        clip -> if loss or grad norm non-finite: skip (counted) else optimizer + scheduler
        log / evaluate / checkpoint
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from tunesmith.config.schema import TrainingConfig
from tunesmith.data.batching import Batch, collate, epoch_batches, steps_per_epoch
from tunesmith.data.encode import EncodedSample
from tunesmith.data.loader import LoaderOptions, batch_iterator
from tunesmith.errors import TrainingError
from tunesmith.models.acceleration import activation_offload
from tunesmith.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    rotate_checkpoints,
    save_checkpoint,
)
from tunesmith.train.metrics import MetricsLog
from tunesmith.train.objective import Objective
from tunesmith.train.optim import build_optimizer, build_scheduler
from tunesmith.train.throughput import Throughput

log = logging.getLogger(__name__)


@dataclass
class LoopState:
    step: int = 0  # optimizer steps done (skipped ones included)
    epoch: int = 0
    batch_in_epoch: int = 0  # next micro-batch index within the epoch
    tokens_seen: int = 0
    trained_tokens_seen: int = 0
    nonfinite_total: int = 0
    nonfinite_run: int = 0
    elapsed: float = 0.0
    last_loss: float = float("nan")


@dataclass
class LoopResult:
    state: LoopState
    total_steps: int
    eval_loss: float | None
    throughput: dict[str, Any]


class Trainer:
    def __init__(self, model: torch.nn.Module, objective: Objective,
                 train: list[EncodedSample], val: list[EncodedSample], cfg: TrainingConfig,
                 *, pad_id: int, device: torch.device, output_dir: Path,
                 metrics: MetricsLog, checkpoint_extra: Any = None,
                 flops_per_token: Any = None, loader: LoaderOptions | None = None):
        self.model, self.objective, self.cfg = model, objective, cfg
        self.train, self.val = train, val
        self.pad_id, self.device, self.output_dir = pad_id, device, output_dir
        self.metrics, self.checkpoint_extra = metrics, checkpoint_extra
        self.accum = cfg.gradient_accumulation_steps
        self.bs = cfg.per_device_train_batch_size
        self.loader = loader or LoaderOptions()
        self._plans: dict[int, list[list[int]]] = {}
        self.steps_per_epoch = steps_per_epoch(len(train), self.bs, self.accum,
                                               len(self.epoch_plan(0)))
        self.total_steps = cfg.max_steps or math.ceil(cfg.num_train_epochs * self.steps_per_epoch)
        self.optimizer = build_optimizer(model, cfg)
        self.scheduler = build_scheduler(self.optimizer, cfg, self.total_steps)
        self.amp_dtype = _amp_dtype(cfg, device)
        self.scaler = (torch.amp.GradScaler("cuda", init_scale=2.0 ** 12)
                       if self.amp_dtype == torch.float16 else None)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.state = LoopState()
        self.throughput = Throughput(device, flops_per_token)

    # ----- data position -------------------------------------------------------------
    def epoch_plan(self, epoch: int) -> list[list[int]]:
        """Micro-batches (sample indices) of an epoch: a pure function of (seed, epoch)."""
        if epoch not in self._plans:
            self._plans = {e: p for e, p in self._plans.items() if e >= epoch - 1}
            self._plans[epoch] = epoch_batches(
                len(self.train), self.bs, epoch, self.cfg.seed,
                getattr(self.train, "lengths", None), self.loader.batch_tokens)
        return self._plans[epoch]

    def _step_batches(self) -> list[list[int]]:
        """Sample indices of the micro-batches of the next optimizer step (advances state)."""
        s = self.state
        order = self.epoch_plan(s.epoch)
        chunk = order[s.batch_in_epoch:s.batch_in_epoch + self.accum]
        s.batch_in_epoch += len(chunk)
        if s.batch_in_epoch >= len(order):
            s.epoch, s.batch_in_epoch = s.epoch + 1, 0
        return chunk

    # ----- one optimizer step --------------------------------------------------------
    def _autocast(self):
        if self.amp_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self, micro: list[Batch]) -> tuple[float, float]:
        """One optimizer step over `micro`; returns (loss per trained token, grad norm)."""
        n_targets = sum(b.n_targets for b in micro)
        total = torch.zeros((), device=self.device)
        for batch in micro:
            with self._autocast(), activation_offload(self.cfg.gradient_checkpointing,
                                                      self.device):
                loss_sum = self.objective.loss_sum(self.model, batch.to(self.device))
            scaled = loss_sum / max(n_targets, 1)
            (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            total += scaled.detach().float()
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        max_norm = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm)
        loss, norm = float(total), float(grad_norm)  # one host sync per optimizer step
        if math.isfinite(loss) and math.isfinite(norm):
            if self.scaler:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
            self.scheduler.step()
            self.state.nonfinite_run = 0
        else:
            if self.scaler:
                self.scaler.update()  # lowers the loss scale
            self._count_nonfinite(loss, norm)
        self.optimizer.zero_grad(set_to_none=True)
        return loss, norm

    def _count_nonfinite(self, loss: float, norm: float) -> None:
        s = self.state
        s.nonfinite_total += 1
        s.nonfinite_run += 1
        log.warning("step %d: non-finite loss %s / grad norm %s; optimizer step skipped "
                    "(%d in a row, %d in all)", s.step + 1, loss, norm, s.nonfinite_run,
                    s.nonfinite_total)
        self.metrics.write({"step": s.step + 1, "skipped_nonfinite": True, "loss_raw": loss,
                            "grad_norm_raw": norm})
        if s.nonfinite_run >= self.cfg.max_nonfinite_steps:
            last = latest_checkpoint(self.output_dir)
            keep = f"the last good checkpoint is {last}" if last else "no checkpoint was written"
            raise TrainingError(
                f"{s.nonfinite_run} optimizer steps in a row had a non-finite loss or gradient "
                f"(last at step {s.step + 1}); stopping. Likely causes: fp16 overflow (use bf16 "
                "or a lower learning rate), a learning rate too high (lower learning_rate, add "
                f"warmup), or corrupt data. {keep}; weights were never updated with NaN.")

    # ----- evaluation ----------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self) -> float | None:
        if not self.val:
            return None
        self.model.eval()
        total, count = 0.0, 0
        bs = self.cfg.per_device_eval_batch_size
        for i in range(0, len(self.val), bs):
            batch = collate(self.val[i:i + bs], self.pad_id).to(self.device)
            with self._autocast():
                total += float(self.objective.loss_sum(self.model, batch))
            count += batch.n_targets
        self.model.train()
        return total / max(count, 1)

    # ----- checkpoints ---------------------------------------------------------------
    def save(self) -> Path:
        s = self.state
        meta = {**asdict(s), "total_steps": self.total_steps}
        opt = None if self.cfg.save_only_model else self.optimizer
        path = save_checkpoint(self.output_dir, s.step, self.model, opt, self.scheduler,
                               self.scaler, meta, self.checkpoint_extra)
        rotate_checkpoints(self.output_dir, self.cfg.save_total_limit)
        return path

    def resume(self, spec: str) -> None:
        path = latest_checkpoint(self.output_dir) if spec == "auto" else Path(spec)
        if path is None:
            log.info("resume_from_checkpoint: auto found no checkpoint; starting fresh")
            return
        meta = load_checkpoint(path, self.model, self.optimizer, self.scheduler, self.scaler)
        fields = set(LoopState.__dataclass_fields__)
        self.state = LoopState(**{k: v for k, v in meta.items() if k in fields})
        log.info("resumed from %s at step %d", path, self.state.step)
        print(f"resumed from {path} (step {self.state.step} of {self.total_steps})")

    # ----- the loop --------------------------------------------------------------------
    def run(self) -> LoopResult:
        s, cfg = self.state, self.cfg
        self.model.train()
        bar = tqdm(total=self.total_steps, initial=s.step, desc="train", unit="step",
                   dynamic_ncols=True)
        start = time.perf_counter() - s.elapsed
        eval_loss = None
        window_losses: list[float] = []
        batches = batch_iterator(self.train, self.epoch_plan, s.epoch, s.batch_in_epoch,
                                 self.pad_id, self.loader, self.device)
        while s.step < self.total_steps:
            t0 = time.perf_counter()
            micro = [next(batches) for _ in self._step_batches()]
            self.throughput.add_data_wait(time.perf_counter() - t0)
            loss, norm = self.train_step(micro)
            s.step += 1
            s.tokens_seen += sum(b.n_tokens for b in micro)
            s.trained_tokens_seen += sum(b.n_targets for b in micro)
            self.throughput.add_step(micro)
            if math.isfinite(loss):
                window_losses.append(loss)
                s.last_loss = loss
            s.elapsed = time.perf_counter() - start
            bar.update(1)
            if s.step % cfg.logging_steps == 0 or s.step == self.total_steps:
                self._log(window_losses, norm, bar)
                window_losses = []
            if cfg.eval_steps and s.step % cfg.eval_steps == 0 and cfg.eval_strategy != "no":
                eval_loss = self._log_eval()
            if cfg.save_steps and s.step % cfg.save_steps == 0 and s.step < self.total_steps:
                self.save()
        bar.close()
        if self.val and cfg.eval_strategy != "no":
            eval_loss = self._log_eval()
        return LoopResult(s, self.total_steps, eval_loss, self.throughput.summary(s.elapsed))

    def _log(self, losses: list[float], norm: float, bar: tqdm) -> None:
        s = self.state
        rate = self.throughput.recent()
        remaining = (self.total_steps - s.step) * (s.elapsed / max(s.step, 1))
        record = {"step": s.step, "epoch": round(s.step / max(self.steps_per_epoch, 1), 4),
                  "loss": sum(losses) / len(losses) if losses else float("nan"),
                  "lr": self.scheduler.get_last_lr()[0], "grad_norm": norm,
                  "tokens_per_s": rate["tokens_per_s"],
                  "trained_tokens_per_s": rate["trained_tokens_per_s"],
                  "elapsed_s": round(s.elapsed, 3), "eta_s": round(remaining, 1),
                  "peak_mem_gb": self.throughput.peak_memory_gb(),
                  "total_steps": self.total_steps}
        self.metrics.write(record)
        bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{rate['tokens_per_s']:.0f}")

    def _log_eval(self) -> float | None:
        loss = self.evaluate()
        if loss is not None:
            ppl = math.exp(min(loss, 50.0))
            self.metrics.write({"step": self.state.step, "eval_loss": loss, "eval_ppl": ppl})
            tqdm.write(f"step {self.state.step}: eval loss {loss:.4f} (perplexity {ppl:.2f})")
        return loss


def _amp_dtype(cfg: TrainingConfig, device: torch.device) -> torch.dtype | None:
    if device.type != "cuda":
        if cfg.bf16 or cfg.fp16:
            log.info("bf16/fp16 apply on GPU only; this CPU run computes in fp32")
        return None
    if cfg.bf16:
        return torch.bfloat16
    if cfg.fp16:
        return torch.float16
    return None
