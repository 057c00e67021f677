"""The one training loop. Objectives, logging, evaluation and checkpoints plug into it.

    for each optimizer step:
        micro-batches <- next `gradient_accumulation_steps` x world entries of the epoch
                         plan, dealt out to the ranks in turn (dist/sharding.py)
        n <- trained tokens of the whole step, summed over all ranks (one all-reduce)
        for each shard: backward(loss_sum * world / n)   # engines average over ranks, so
                                                         # this equals one process, one batch
        clip -> if loss or grad norm non-finite: skip (counted) else optimizer + scheduler
                (decided on the device and read one step late where it can: train/lagged.py)
        log / evaluate / checkpoint (rank 0 writes)
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from tunesmith.config.optim_keys import OptimConfig
from tunesmith.config.run_keys import RunConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.data.batching import Batch, collate
from tunesmith.data.encode import EncodedSample
from tunesmith.data.loader import LoaderOptions, batch_iterator
from tunesmith.distributed.context import (
    DistContext,
    all_reduce_sum,
    reduce_tensor,
)
from tunesmith.distributed.sharding import Shard, shard_step, steps_in_plan
from tunesmith.distributed.strategy import Strategy
from tunesmith.errors import ConfigError, TrainingError
from tunesmith.models.acceleration import activation_offload
from tunesmith.models.host_embedding import find_host_embedding
from tunesmith.train.best import BestTracker
from tunesmith.train.cadence import evaluation_due, final_evaluation_due
from tunesmith.train.lagged import PendingStep, lagged_steps_apply, settle_ready, step_on_device
from tunesmith.train.memory import MicroBatchSizer, out_of_memory_message
from tunesmith.train.metrics import MetricsLog, objective_metrics
from tunesmith.train.nonfinite import count_nonfinite
from tunesmith.train.objective import Objective
from tunesmith.train.optim import build_optimizer, build_scheduler
from tunesmith.train.run_setup import amp_dtype
from tunesmith.train.saving import resume_trainer, save_trainer
from tunesmith.train.schedule_points import epoch_plan, log_due, save_due, values_needed
from tunesmith.train.stopping import GracefulStop
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
    stopped: bool = False  # a stop was requested (SIGTERM/SIGINT); a checkpoint was written
    checkpoint: Path | None = None  # the checkpoint written at the stop


class Trainer:
    def __init__(self, model: torch.nn.Module, objective: Objective,
                 train: list[EncodedSample], val: list[EncodedSample], cfg: TrainingConfig,
                 *, pad_id: int, device: torch.device, output_dir: Path,
                 metrics: MetricsLog | None, checkpoint_extra: Any = None,
                 flops_per_token: Any = None, strategy: Strategy | None = None,
                 loader: LoaderOptions | None = None, optim: OptimConfig | None = None,
                 run: RunConfig | None = None):
        self.model, self.objective, self.cfg = model, objective, cfg
        self.run_cfg = run or RunConfig()  # LLaMA-Factory trainer keys (config/run_keys.py)
        self.train, self.val = train, val
        self.pad_id, self.device, self.output_dir = pad_id, device, output_dir
        self.metrics, self.checkpoint_extra = metrics, checkpoint_extra  # metrics: rank 0 only
        self.strategy = strategy or Strategy("single", DistContext(device=device), cfg)
        self.ctx = self.strategy.ctx
        self.world = self.ctx.world_size
        self.accum = cfg.gradient_accumulation_steps
        self.bs = cfg.per_device_train_batch_size
        self.loader = loader or LoaderOptions()
        self._plans: dict[int, list[list[int]]] = {}
        self.steps_per_epoch = steps_in_plan(len(self.epoch_plan(0)), self.accum, self.world)
        self.total_steps = cfg.max_steps or math.ceil(cfg.num_train_epochs * self.steps_per_epoch)
        self.strategy.wrap(model, objective)  # before the optimizer: FSDP2 shards parameters
        self.optimizer = build_optimizer(model, cfg, optim)
        self.scheduler = build_scheduler(self.optimizer, cfg, self.total_steps,
                                         self.run_cfg.lr_scheduler_kwargs)
        self.strategy.attach_optimizer(self.optimizer)
        self.amp_dtype = amp_dtype(cfg, device)
        own_scaler = self.amp_dtype == torch.float16 and self.strategy.name != "deepspeed"
        self.scaler = torch.amp.GradScaler("cuda", init_scale=2.0 ** 12) if own_scaler else None
        self.state = LoopState()
        self.last_step_tokens = 0
        self.throughput = Throughput(device, flops_per_token)
        if cfg.auto_batch_size and self.world > 1:
            raise ConfigError("auto_batch_size: works in single-process runs only (every rank "
                              "must take the same micro-batches); set "
                              "per_device_train_batch_size for distributed training")
        self.sizer = (MicroBatchSizer(self.bs * self.accum, cfg.memory_threshold, device)
                      if cfg.auto_batch_size else None)
        self._batches: Any = None  # the loader's iterator, set by run()
        self.lagged = lagged_steps_apply(self)  # steps without a host sync (train/lagged.py)
        self.stop = GracefulStop()  # checked after each optimizer step
        self.compile_guard: Any = None  # models.speed.CompileGuard: compile failure -> eager
        self.eval_groups: dict[str, list[int]] = {}  # eval_on_each_dataset: name -> samples
        self.best = BestTracker(model, self.run_cfg, bool(val),
                                self.strategy.name in ("fsdp", "deepspeed"))
        self.host_embedding = find_host_embedding(model)  # offload: the table on the host
        self.flattened_batches = 0  # padding_free: micro-batches trained as one row each

    def _to_device(self, batch: Batch) -> Batch:
        moved = batch.to(self.device)
        if self.host_embedding is not None:  # gather its rows while the ids are on the host
            self.host_embedding.stage(batch.input_ids, moved.input_ids)
        return moved

    # ----- data position -------------------------------------------------------------
    def epoch_plan(self, epoch: int) -> list[list[int]]:
        """Micro-batches (sample indices) of an epoch: a pure function of (seed, epoch)."""
        if epoch not in self._plans:
            self._plans = {e: p for e, p in self._plans.items() if e >= epoch - 1}
            self._plans[epoch] = epoch_plan(self, epoch)
        return self._plans[epoch]

    def _step_batches(self) -> list[Shard]:
        """This rank's micro-batches of the next optimizer step (advances state);
        `batch_in_epoch` counts plan entries, the same on every rank."""
        s = self.state
        order = self.epoch_plan(s.epoch)
        chunk = order[s.batch_in_epoch:s.batch_in_epoch + self.accum * self.world]
        s.batch_in_epoch += len(chunk)
        if s.batch_in_epoch >= len(order):
            s.epoch, s.batch_in_epoch = s.epoch + 1, 0
        return shard_step(chunk, self.ctx.rank, self.world)

    # ----- one optimizer step --------------------------------------------------------
    def _autocast(self):  # DeepSpeed: its engine sets the precision (bf16/fp16 sections)
        if self.amp_dtype is None or self.strategy.name == "deepspeed":
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.amp_dtype)

    def train_step(self, micro: list[Batch], live: list[bool] | None = None,
                   lagged: bool = False) -> tuple[float, float] | PendingStep:
        """One optimizer step over this rank's `micro`-batches (`live[i]` False: a weight-0
        filler). Returns (loss per trained token of the whole step over all ranks, grad
        norm), the same on every rank, or with `lagged` the same on their way to the host;
        the step's real tokens over all ranks go to `self.last_step_tokens`."""
        live = live if live is not None else [True] * len(micro)
        local_targets = sum(b.loss_units for b, ok in zip(micro, live, strict=True) if ok)
        local_tokens = sum(b.n_tokens for b, ok in zip(micro, live, strict=True) if ok)
        if self.ctx.distributed:  # global count before any backward, kept on the device
            n_global = reduce_tensor([local_targets], self.ctx)[0]
            factor: torch.Tensor | float = (self.world / n_global.clamp(min=1.0)).float()
        else:
            factor = 1.0 / max(local_targets, 1)
        total = torch.zeros((), device=self.device)
        for i, (batch, ok) in enumerate(zip(micro, live, strict=True)):
            with self.strategy.micro_context(last=i == len(micro) - 1):
                with self._autocast(), activation_offload(self.cfg.gradient_checkpointing,
                                                          self.device):
                    loss_sum = self.strategy.loss_module(_with_live(self._to_device(batch),
                                                                    ok))
                scaled = loss_sum * (factor if ok else 0.0)  # a filler shard adds nothing
                self.strategy.backward(self.scaler.scale(scaled) if self.scaler else scaled)
            total += scaled.detach().float()
        if lagged:
            self.last_step_tokens = local_tokens
            return step_on_device(self, total)
        loss, tokens = all_reduce_sum([float(total) / self.world, local_tokens], self.ctx)
        self.last_step_tokens = int(tokens)
        norm, stepped = self.strategy.finish_step(self.optimizer, self.scaler,
                                                  self.cfg.max_grad_norm, math.isfinite(loss))
        if stepped:
            self.scheduler.step()
            self.state.nonfinite_run = 0
        else:
            count_nonfinite(self, loss, norm)
        return loss, norm

    def _write_metrics(self, record: dict[str, Any]) -> None:
        if self.ctx.is_main and self.metrics is not None:
            self.metrics.write(record)

    # ----- evaluation ----------------------------------------------------------------
    @torch.no_grad()
    def evaluate(self, subset: list[int] | None = None) -> float | None:
        """Mean loss per target token over the validation set (or its `subset`), by shards."""
        picks = list(range(len(self.val))) if subset is None else subset
        if not picks:
            return None
        self.strategy.loss_module.eval()
        bs = self.cfg.per_device_eval_batch_size
        plan = [picks[i:i + bs] for i in range(0, len(picks), bs)]
        total, count = 0.0, 0
        for shard in shard_step(plan, self.ctx.rank, self.world):
            batch = _with_live(self._to_device(collate([self.val[i] for i in shard.indices],
                                                       self.pad_id, self.loader.flatten)),
                               shard.live)
            with self._autocast():
                loss = float(self.strategy.loss_module(batch))
            if shard.live:
                total, count = total + loss, count + batch.loss_units
        self.strategy.loss_module.train()
        total, count = all_reduce_sum([total, count], self.ctx)
        return total / max(count, 1)

    # ----- checkpoints (every rank calls; rank 0 writes) -------------------------------
    def save(self) -> Path:
        return save_trainer(self)

    def resume(self, spec: str) -> None:
        resume_trainer(self, spec)

    # ----- graceful stop ---------------------------------------------------------------
    def request_stop(self) -> None:
        """Finish the current optimizer step, write a checkpoint and return from run()."""
        self.stop.request()

    def _stop_with_checkpoint(self) -> Path:
        path = self.save()
        self._write_metrics({"step": self.state.step, "stopped": True, "checkpoint": str(path),
                             "total_steps": self.total_steps})
        if self.ctx.is_main:
            tqdm.write(f"stopped at step {self.state.step} of {self.total_steps}; checkpoint "
                       f"{path}; continue with resume_from_checkpoint: auto")
        return path

    # ----- the loop --------------------------------------------------------------------
    def run(self) -> LoopResult:
        with self.stop.handling_signals():
            try:
                return self._run()
            finally:  # workers stop now; freed later in a gc cycle, each waits 5 s for
                self._batches = None  # a stop message its closed queue never sends

    def _run(self) -> LoopResult:
        s, cfg = self.state, self.cfg
        self.strategy.loss_module.train()
        bar = tqdm(total=self.total_steps, initial=s.step, desc="train", unit="step",
                   dynamic_ncols=True,
                   disable=not self.ctx.is_main or self.run_cfg.disable_tqdm)
        start = time.perf_counter() - s.elapsed
        eval_loss, last_eval_step = None, None
        window_losses: list[float] = []
        pending: list[PendingStep] = []  # lagged steps whose values are not read yet
        norm = float("nan")
        # One process: batches come from the loader (workers, pinned memory, prefetch) in
        # plan order. Several ranks or auto_batch_size: this rank's shards are collated here.
        self.throughput.start()
        self._batches = (batch_iterator(self.train, self.epoch_plan, s.epoch,
                                        s.batch_in_epoch, self.pad_id, self.loader, self.device)
                         if self.world == 1 and self.sizer is None else None)
        while s.step < self.total_steps:
            start_epoch = s.epoch
            micro, live, result = self._run_step(self._step_batches())
            s.step += 1
            s.tokens_seen += self.last_step_tokens
            s.trained_tokens_seen += sum(b.n_targets for b, ok in zip(micro, live, strict=True)
                                         if ok)
            self.throughput.add_step([b for b, ok in zip(micro, live, strict=True) if ok])
            if self.loader.flatten:
                self.flattened_batches += sum(b.cu_seqlens is not None for b in micro)
            outcomes = ([result] if not isinstance(result, PendingStep) else
                        settle_ready(self, pending, result, values_needed(self, start_epoch)))
            window_losses += [loss for loss, _ in outcomes if math.isfinite(loss)]
            s.last_loss = window_losses[-1] if window_losses else s.last_loss
            norm = outcomes[-1][1] if outcomes else norm
            s.elapsed = time.perf_counter() - start
            bar.update(1)
            if log_due(s.step, cfg, self.run_cfg, self.total_steps, self.steps_per_epoch):
                self._log(window_losses, norm, bar)
                window_losses = []
            if evaluation_due(cfg, s.step, epoch_ended=s.epoch != start_epoch):
                eval_loss, last_eval_step = self._log_eval(), s.step
                if self.best.stop_early():
                    break
            if s.step < self.total_steps and self.stop.agreed(self.ctx):
                bar.close()
                return LoopResult(s, self.total_steps, eval_loss,
                                  self.throughput.summary(s.elapsed), stopped=True,
                                  checkpoint=self._stop_with_checkpoint())
            if s.step < self.total_steps and save_due(self, start_epoch):
                self.save()
        bar.close()
        best_step = self.best.restore_best()  # load_best_model_at_end
        if best_step is not None and best_step != last_eval_step:
            last_eval_step = None  # other weights than the last evaluation's: evaluate them
        if self.val and final_evaluation_due(cfg, s.step, last_eval_step):
            eval_loss = self._log_eval()
        perf = self.throughput.summary(s.elapsed)
        return LoopResult(s, self.total_steps, eval_loss, self._global_perf(perf))

    def _global_perf(self, perf: dict[str, Any]) -> dict[str, Any]:
        """Per-rank throughput -> whole-run figures; MFU and memory stay per GPU."""
        if not self.ctx.distributed:
            return perf
        tokens, trained = all_reduce_sum([perf["tokens"], perf["trained_tokens"]], self.ctx)
        elapsed = perf["elapsed_s"] or 1.0
        return {**perf, "world_size": self.world, "strategy": self.strategy.name,
                "tokens": int(tokens), "trained_tokens": int(trained),
                "tokens_per_s": tokens / elapsed, "trained_tokens_per_s": trained / elapsed,
                "tokens_per_s_per_gpu": tokens / elapsed / self.world}

    def _collate_step(self, groups: list[list[int]]) -> list[Batch]:
        t0 = time.perf_counter()
        if self._batches is not None:  # the loader yields exactly these groups, in order
            micro = [next(self._batches) for _ in groups]
        else:
            micro = [collate([self.train[i] for i in idx], self.pad_id, self.loader.flatten)
                     for idx in groups]
        self.throughput.add_data_wait(time.perf_counter() - t0)
        return micro

    def _run_step(self, shards: list[Shard]
                  ) -> tuple[list[Batch], list[bool], tuple[float, float]]:
        """Train one optimizer step from this rank's shards; with auto_batch_size (single
        process), re-split its samples into smaller micro-batches on out-of-memory."""
        indices = [i for sh in shards if sh.live for i in sh.indices]
        while True:
            if self.sizer is not None:
                groups = self.sizer.split(indices)
                live = [True] * len(groups)
            else:
                groups, live = [sh.indices for sh in shards], [sh.live for sh in shards]
            micro = self._collate_step(groups)
            try:
                result = self.train_step(micro, live, self.lagged)
            except torch.OutOfMemoryError:
                self.optimizer.zero_grad(set_to_none=True)
                del micro
                if self.device.type == "cuda":
                    torch.cuda.empty_cache()
                if self.sizer is not None and self.sizer.back_off("out of memory"):
                    continue
                raise TrainingError(out_of_memory_message(
                    self.cfg, self.device, max(len(g) for g in groups),
                    max((len(self.train[i]) for i in indices), default=0))) from None
            except Exception as exc:  # a compile failure: the same micro-batches, eagerly
                if self.compile_guard is None or not self.compile_guard.recover(exc):
                    raise
                self.optimizer.zero_grad(set_to_none=True)
                result = self.train_step(micro, live, self.lagged)
            if self.sizer is not None:
                self.sizer.check_peak()
            return micro, live, result

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
                  "total_steps": self.total_steps, **{k: rate[k] for k in ("mfu",) if k in rate}}
        if self.run_cfg.include_num_input_tokens_seen:
            record["num_input_tokens_seen"] = s.tokens_seen
        if self.world > 1:  # this rank's rate x ranks (shards are near equal in size)
            record["tokens_per_s"] *= self.world
            record["trained_tokens_per_s"] *= self.world
        record.update(objective_metrics(self.objective, "train", self.ctx))
        self._write_metrics(record)
        bar.set_postfix(loss=f"{record['loss']:.4f}", tok_s=f"{record['tokens_per_s']:.0f}")

    def _log_eval(self) -> float | None:
        loss = self.evaluate()
        extra = objective_metrics(self.objective, "eval", self.ctx)  # every rank takes part
        extra.update({f"eval_{n}_loss": self.evaluate(p) for n, p in self.eval_groups.items()})
        if loss is not None and self.ctx.is_main:
            ppl = math.exp(min(loss, 50.0))
            self._write_metrics({"step": self.state.step, "eval_loss": loss, "eval_ppl": ppl,
                                 **extra})
        if loss is not None:
            self.best.observe(self.state.step, loss)
            tqdm.write(f"step {self.state.step}: eval loss {loss:.4f} (perplexity {ppl:.2f})")
        return loss


def _with_live(batch: Batch, live: bool) -> Batch:
    batch.live = live  # a filler's statistics stay out of the objective's sums
    return batch
