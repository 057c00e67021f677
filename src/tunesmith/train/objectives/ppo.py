"""PPO's arithmetic on response tokens (Schulman et al. 2017; RLHF as in Ziegler et al. 2019
and TRL 0.9, which LLaMA-Factory's `stage: ppo` runs): all tensors are [B, T] over the
response tokens, `mask` 1 on real tokens, 0 on padding after a response's end.

    per-token reward   r_t = -kl_coef * (log pi_old - log ref)_t  (+ score on the last token)
    GAE (gamma, lam)   delta_t = r_t + gamma * V_{t+1} - V_t
                       A_t = delta_t + gamma * lam * A_{t+1};  returns R_t = A_t + V_t
                       A whitened over the batch's real tokens
    policy loss        mean over tokens of max(-A * ratio, -A * clip(ratio, 1 -+ eps))
    value loss         0.5 * mean of max((V - R)^2, (clip(V, V_old -+ eps_v) - R)^2)
    loss               policy + vf_coef * value
    adaptive KL        kl_coef *= 1 + clip(kl / target - 1, -0.2, 0.2) * n / horizon

Each has a plain-Python twin (`*_reference`) written from these formulas for the tests.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PpoSettings:
    gamma: float = 1.0
    lam: float = 0.95
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    whiten_rewards: bool = False  # ppo_whiten_rewards
    ratio_threshold: float = 10.0  # a micro-batch whose mean ratio exceeds it is skipped


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (x * mask).sum() / mask.sum().clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True
                  ) -> torch.Tensor:
    """(x - mean) / std over the real tokens (unbiased variance); `shift_mean` False keeps
    the mean (whitened rewards keep their sign)."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = masked_mean((x - mean) ** 2, mask) * n / (n - 1).clamp(min=1)
    out = (x - mean) * torch.rsqrt(var + 1e-8)
    return out if shift_mean else out + mean


def token_rewards(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, scores: torch.Tensor,
                  mask: torch.Tensor, kl_coef: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token rewards [B, T] and the per-token KL [B, T]; scores [B] go to each
    response's last real token."""
    kl = (logprobs - ref_logprobs) * mask
    rewards = -kl_coef * kl
    last = (mask.sum(1).long() - 1).clamp(min=0)  # [B]
    rewards[torch.arange(len(scores)), last] += scores
    return rewards * mask, kl


def advantages_and_returns(values: torch.Tensor, rewards: torch.Tensor, mask: torch.Tensor,
                           s: PpoSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE: whitened advantages and returns, both [B, T], detached."""
    values, rewards = values * mask, rewards * mask
    if s.whiten_rewards:
        rewards = masked_whiten(rewards, mask, shift_mean=False)
    t_len = rewards.shape[1]
    last = torch.zeros_like(rewards[:, 0])
    reversed_adv = []
    for t in reversed(range(t_len)):
        next_value = values[:, t + 1] if t + 1 < t_len else torch.zeros_like(last)
        delta = rewards[:, t] + s.gamma * next_value - values[:, t]
        last = delta + s.gamma * s.lam * last
        reversed_adv.append(last)
    adv = torch.stack(reversed_adv[::-1], dim=1)
    returns = adv + values
    return masked_whiten(adv, mask).detach(), returns.detach()


def ppo_loss(logprobs: torch.Tensor, vpreds: torch.Tensor, old_logprobs: torch.Tensor,
             old_values: torch.Tensor, advantages: torch.Tensor, returns: torch.Tensor,
             mask: torch.Tensor, s: PpoSettings) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped policy loss + vf_coef * clipped value loss (a scalar), and its statistics."""
    v_clipped = old_values + (vpreds - old_values).clamp(-s.cliprange_value, s.cliprange_value)
    vf1, vf2 = (vpreds - returns) ** 2, (v_clipped - returns) ** 2
    vf_loss = 0.5 * masked_mean(torch.max(vf1, vf2), mask)
    log_ratio = logprobs - old_logprobs
    ratio = log_ratio.exp()
    pg1 = -advantages * ratio
    pg2 = -advantages * ratio.clamp(1.0 - s.cliprange, 1.0 + s.cliprange)
    pg_loss = masked_mean(torch.max(pg1, pg2), mask)
    stats = {"policy_loss": pg_loss.detach(), "value_loss": vf_loss.detach(),
             "clipfrac": masked_mean((pg2 > pg1).float(), mask),
             "value_clipfrac": masked_mean((vf2 > vf1).float(), mask),
             "approx_kl": 0.5 * masked_mean(log_ratio.detach() ** 2, mask),
             "ratio": masked_mean(ratio.detach(), mask)}
    return pg_loss + s.vf_coef * vf_loss, stats


class AdaptiveKl:
    """The KL coefficient, moved towards `target` KL (ppo_target) after each PPO step."""

    def __init__(self, init: float = 0.2, target: float = 6.0, horizon: int = 10000):
        self.value, self.target, self.horizon = init, target, horizon

    def update(self, current: float, n_steps: int) -> None:
        error = min(max(current / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon


class RunningMoments:
    """Mean and (unbiased) standard deviation of every score seen so far (ppo_score_norm)."""

    def __init__(self) -> None:
        self.mean, self.var, self.count = 0.0, 1.0, 1e-24

    def update(self, xs: torch.Tensor) -> None:
        n = xs.numel()
        b_mean, b_var = float(xs.double().mean()), float(xs.double().var(unbiased=False))
        delta, total = b_mean - self.mean, self.count + n
        m2 = self.var * self.count + b_var * n + delta ** 2 * self.count * n / total
        self.mean += delta * n / total
        self.var, self.count = m2 / total, total

    @property
    def std(self) -> float:
        return math.sqrt(self.var * self.count / max(self.count - 1, 1e-24))

    def normalise(self, scores: torch.Tensor) -> torch.Tensor:
        """Update with `scores`, then (scores - mean) / std over all scores so far."""
        self.update(scores)
        return (scores - self.mean) / (self.std + torch.finfo(scores.dtype).eps)


# ----- plain-Python twins (one response at a time, written from the formulas) -----------
def gae_reference(rewards: list[float], values: list[float], gamma: float, lam: float
                  ) -> tuple[list[float], list[float]]:
    """Unwhitened advantages and returns of one response."""
    n = len(rewards)
    adv = [0.0] * n
    for t in range(n):
        total = 0.0
        for k in range(t, n):  # A_t = sum_k (gamma * lam)^(k-t) delta_k
            v_next = values[k + 1] if k + 1 < n else 0.0
            delta = rewards[k] + gamma * v_next - values[k]
            total += (gamma * lam) ** (k - t) * delta
        adv[t] = total
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def ppo_token_loss_reference(logp: float, old_logp: float, vpred: float, old_value: float,
                             adv: float, ret: float, s: PpoSettings) -> tuple[float, float]:
    """(policy term, value term) of one token, before averaging."""
    ratio = math.exp(logp - old_logp)
    clipped = min(max(ratio, 1 - s.cliprange), 1 + s.cliprange)
    pg = max(-adv * ratio, -adv * clipped)
    v_clip = min(max(vpred, old_value - s.cliprange_value), old_value + s.cliprange_value)
    vf = 0.5 * max((vpred - ret) ** 2, (v_clip - ret) ** 2)
    return pg, vf
