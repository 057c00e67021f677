"""The PPO loop (stage ppo). Rollouts need generation between optimizer steps, so PPO has
its own short loop beside train/loop.py; optimizer, scheduler, metrics and saving are the
shared ones.

    per PPO step (B = per_device_train_batch_size x gradient_accumulation_steps x
                  ppo_buffer_size prompts, taken in a per-epoch shuffled order):
        rollouts (policy in eval mode): responses, reward scores [B] (score norm: running)
        old log-probs, values (policy) and reference log-probs (adapters disabled), no grad
        per-token rewards (KL penalty), GAE -> advantages, returns
        ppo_epochs x shuffled micro-batches of per_device_train_batch_size:
            loss = clipped policy + vf_coef x clipped value; an optimizer step every
            gradient_accumulation_steps micro-batches
        adaptive KL coefficient update; scheduler step; metrics line
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from tunesmith.config.optim_keys import OptimConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.errors import ConfigError
from tunesmith.models.loader import split_causal_lm
from tunesmith.train.metrics import MetricsLog
from tunesmith.train.objectives.ppo import (
    AdaptiveKl,
    PpoSettings,
    RunningMoments,
    advantages_and_returns,
    masked_mean,
    ppo_loss,
    token_rewards,
)
from tunesmith.train.optim import build_optimizer, build_scheduler
from tunesmith.train.ppo_reward import RewardModel
from tunesmith.train.ppo_rollout import (
    Sampling,
    SequenceBatch,
    build_sequences,
    generate_responses,
    response_entropy,
    response_logprobs_values,
)

log = logging.getLogger(__name__)


@dataclass
class PpoPlan:
    """What the PPO loop needs besides the model (built by recipes/ppo.py)."""

    buffer_size: int = 1
    ppo_epochs: int = 4
    score_norm: bool = False
    kl_target: float = 6.0
    settings: PpoSettings = PpoSettings()
    sampling: Sampling = Sampling()
    stop_ids: frozenset[int] = frozenset()
    pad_id: int = 0


@dataclass
class Rollouts:
    seqs: SequenceBatch
    scores: torch.Tensor  # [B] raw reward-model scores
    logprobs: torch.Tensor  # [B, T] old policy
    values: torch.Tensor  # [B, T]
    advantages: torch.Tensor  # [B, T]
    returns: torch.Tensor  # [B, T]
    kl: torch.Tensor  # [B] summed per-token KL to the reference
    entropy: torch.Tensor  # [K]
    queries: list[list[int]]
    responses: list[list[int]]


class PpoTrainer:
    def __init__(self, model: torch.nn.Module, value_head: torch.nn.Module,
                 reward: RewardModel, prompts: list[list[int]], cfg: TrainingConfig,
                 plan: PpoPlan, *, device: torch.device, metrics: MetricsLog | None,
                 optim: OptimConfig | None = None, disable_tqdm: bool = False,
                 save_checkpoint: Callable[[Path], None] | None = None,
                 output_dir: Path | None = None):
        self.model, self.value_head, self.reward = model, value_head, reward
        self.prompts, self.cfg, self.plan, self.device = prompts, cfg, plan, device
        self.metrics, self.disable_tqdm = metrics, disable_tqdm
        self.save_checkpoint, self.output_dir = save_checkpoint, output_dir
        self.bs, self.accum = cfg.per_device_train_batch_size, cfg.gradient_accumulation_steps
        self.batch = self.bs * self.accum * plan.buffer_size
        self.steps_per_epoch = max(1, math.ceil(len(prompts) / self.batch))
        self.total_steps = cfg.max_steps or math.ceil(cfg.num_train_epochs * self.steps_per_epoch)
        self.optimizer = build_optimizer(model, cfg, optim)
        self.scheduler = build_scheduler(self.optimizer, cfg, self.total_steps)
        self.kl_ctl = AdaptiveKl(target=plan.kl_target)
        self.moments = RunningMoments()
        self.skipped = 0  # micro-batches skipped for a runaway probability ratio
        if device.type == "cuda" and cfg.fp16:
            raise ConfigError("fp16: stage ppo on GPU supports bf16 or fp32 only (no loss "
                              "scaling in its loop yet); set bf16: true instead")

    def autocast(self) -> AbstractContextManager:
        """bf16 autocast on GPU when bf16 is set (the frozen base is bf16 there)."""
        if self.device.type == "cuda" and self.cfg.bf16:
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return nullcontext()

    # ----- prompts ---------------------------------------------------------------------
    def step_prompts(self, step: int) -> list[list[int]]:
        """The prompts of PPO step `step` (0-based): a pure function of (seed, step)."""
        epoch, k = divmod(step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(self.cfg.seed + epoch)
        order = torch.randperm(len(self.prompts), generator=g).tolist()
        return [self.prompts[i] for i in order[k * self.batch:(k + 1) * self.batch]]

    # ----- rollouts --------------------------------------------------------------------
    @torch.no_grad()
    def collect(self, queries: list[list[int]]) -> Rollouts:
        with self.autocast():
            return self._collect(queries)

    def _collect(self, queries: list[list[int]]) -> Rollouts:
        self.model.eval()
        p = self.plan
        responses: list[list[int]] = []
        for i in range(0, len(queries), self.bs):
            responses += generate_responses(self.model, queries[i:i + self.bs], p.sampling,
                                            set(p.stop_ids), p.pad_id, self.device)
        scores = torch.cat([self.reward.scores(queries[i:i + self.bs],
                                               responses[i:i + self.bs])
                            for i in range(0, len(queries), self.bs)])
        seqs = build_sequences(queries, responses, p.pad_id, self.device)
        logprobs, values, rows = response_logprobs_values(self.model, self.value_head, seqs)
        entropy = response_entropy(rows, split_causal_lm(self.model)[1])
        with self.model.disable_adapter():  # the reference: the base without adapters
            ref_logprobs, _, _ = response_logprobs_values(self.model, None, seqs)
        used = self.moments.normalise(scores) if p.score_norm else scores
        rewards, kl = token_rewards(logprobs, ref_logprobs, used.to(self.device), seqs.mask,
                                    self.kl_ctl.value)
        adv, returns = advantages_and_returns(values, rewards, seqs.mask, p.settings)
        return Rollouts(seqs, scores, logprobs, values, adv, returns, kl.sum(1), entropy,
                        queries, responses)

    # ----- optimisation ----------------------------------------------------------------
    def optimise(self, r: Rollouts, step: int = 0) -> dict[str, float]:
        """ppo_epochs passes over the rollouts in shuffled micro-batches (a pure function of
        seed, step and epoch); returns the mean statistics."""
        self.model.train()
        sums: dict[str, float] = {}
        count, n = 0, len(r.queries)
        for epoch in range(self.plan.ppo_epochs):
            g = torch.Generator().manual_seed(
                self.cfg.seed * 7919 + step * self.plan.ppo_epochs + epoch)
            order = torch.randperm(n, generator=g).tolist()
            micro = [order[i:i + self.bs] for i in range(0, n, self.bs)]
            for k, idx in enumerate(micro):
                stats = self._micro_step(r, idx)
                for name, v in stats.items():
                    sums[name] = sums.get(name, 0.0) + v
                count += 1
                if (k + 1) % self.accum == 0 or k == len(micro) - 1:
                    sums["grad_norm"] = sums.get("grad_norm", 0.0) + self._optimizer_step()
        steps = sum(math.ceil(len(range(0, n, self.bs)) / self.accum)
                    for _ in range(self.plan.ppo_epochs))
        out = {k: v / count for k, v in sums.items() if k != "grad_norm"}
        out["grad_norm"] = sums.get("grad_norm", 0.0) / max(steps, 1)
        return out

    def _micro_step(self, r: Rollouts, idx: list[int]) -> dict[str, float]:
        seqs = build_sequences([r.queries[i] for i in idx], [r.responses[i] for i in idx],
                               self.plan.pad_id, self.device)
        sel = torch.tensor(idx, device=self.device)
        width = seqs.width  # the micro-batch's longest response <= the buffer's

        def pick(x: torch.Tensor) -> torch.Tensor:
            return x.index_select(0, sel)[:, :width]

        with self.autocast():
            logprobs, vpreds, _ = response_logprobs_values(self.model, self.value_head, seqs)
        loss, stats = ppo_loss(logprobs, vpreds, pick(r.logprobs), pick(r.values),
                               pick(r.advantages), pick(r.returns), seqs.mask,
                               self.plan.settings)
        if float(stats["ratio"]) > self.plan.settings.ratio_threshold:
            self.skipped += 1  # TRL's guard against a runaway update: no gradient from it
            log.warning("ppo: a micro-batch's mean probability ratio %.2f exceeds %.1f; "
                        "skipped (%d so far)", float(stats["ratio"]),
                        self.plan.settings.ratio_threshold, self.skipped)
            loss = loss * 0.0
        (loss / self.accum).backward()
        return {"loss": float(loss.detach()), **{k: float(v) for k, v in stats.items()}}

    def _optimizer_step(self) -> float:
        params = [p for p in self.model.parameters() if p.requires_grad]
        clip = self.cfg.max_grad_norm if self.cfg.max_grad_norm > 0 else float("inf")
        norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
        if math.isfinite(norm):
            self.optimizer.step()
        else:
            log.warning("ppo: non-finite gradient norm; optimizer step skipped")
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    # ----- the loop --------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        bar = tqdm(total=self.total_steps, desc="ppo", unit="step", dynamic_ncols=True,
                   disable=self.disable_tqdm)
        start, last = time.perf_counter(), {}
        for step in range(self.total_steps):
            rollouts = self.collect(self.step_prompts(step))
            stats = self.optimise(rollouts, step)
            kl = float(rollouts.kl.mean())
            self.kl_ctl.update(kl, len(rollouts.queries))
            self.scheduler.step()
            last = self._record(step + 1, rollouts, stats, kl, time.perf_counter() - start)
            bar.update(1)
            bar.set_postfix(reward=f"{last['reward']:.3f}", kl=f"{kl:.3f}")
            if self._save_due(step + 1) and self.save_checkpoint and self.output_dir:
                self.save_checkpoint(self.output_dir / f"checkpoint-{step + 1}")
        bar.close()
        return {"steps": self.total_steps, "elapsed_s": round(time.perf_counter() - start, 3),
                "skipped_micro_batches": self.skipped, "last": last}

    def _save_due(self, step: int) -> bool:
        every = self.cfg.save_steps
        return bool(every) and step % int(every) == 0 and step < self.total_steps

    def _record(self, step: int, r: Rollouts, stats: dict[str, float], kl: float,
                elapsed: float) -> dict[str, Any]:
        lengths = r.seqs.mask.sum(1)
        record = {"step": step, "epoch": round(step / self.steps_per_epoch, 4),
                  "loss": stats["loss"], "reward": float(r.scores.mean()),
                  "reward_std": float(r.scores.std()) if len(r.scores) > 1 else 0.0,
                  "kl": kl, "kl_coef": self.kl_ctl.value,
                  "policy_loss": stats["policy_loss"], "value_loss": stats["value_loss"],
                  "clipfrac": stats["clipfrac"], "value_clipfrac": stats["value_clipfrac"],
                  "approx_kl": stats["approx_kl"],
                  "entropy": float(r.entropy.mean()) if r.entropy.numel() else 0.0,
                  "advantage_mean": float(masked_mean(r.advantages, r.seqs.mask)),
                  "response_length": float(lengths.mean()), "grad_norm": stats["grad_norm"],
                  "lr": self.scheduler.get_last_lr()[0], "elapsed_s": round(elapsed, 3),
                  "total_steps": self.total_steps}
        if self.metrics is not None and (step % max(self.cfg.logging_steps, 1) == 0
                                         or step == self.total_steps):
            self.metrics.write(record)
        return record
