"""KTO (Ethayarajh et al. 2024): answers labelled desirable or undesirable, no pairs.

    r = log pi(y|x) - log ref(y|x)                      (implicit reward, sums over tokens)
    z = max(0, mean over the batch of [log pi - log ref] of mismatched (x, y') completions)
    desirable:   L = w_D * (1 - sigmoid(beta * (r - z)))
    undesirable: L = w_U * (1 - sigmoid(beta * (z - r)))

z estimates KL(pi || ref) and is not differentiated through; with several ranks it is the
mean over the mismatched completions of all ranks (one all-reduce of sum and count, as in
the paper and TRL), so 2 ranks of B items give the z of one process with 2B. `pref_ftx` adds the mean
negative token log-prob of desirable answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tunesmith.distributed.context import several_ranks


@dataclass(frozen=True)
class KtoSettings:
    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0
    ftx: float = 0.0


def kto_kl(kl_policy: torch.Tensor, kl_ref: torch.Tensor, live: bool = True) -> torch.Tensor:
    """The batch's KL estimate z (detached, clamped at 0), over every rank's mismatched
    completions when a process group is up; a filler shard (`live` False) adds nothing.
    [P], [P] -> scalar."""
    diff = (kl_policy - kl_ref).detach().double() * float(live)
    total = torch.stack([diff.sum(), torch.tensor(float(diff.numel() * live),
                                                   dtype=torch.float64, device=diff.device)])
    if several_ranks():
        dist.all_reduce(total)  # every rank runs every micro-batch (fillers too): same count
    return (total[0] / total[1].clamp(min=1)).clamp(min=0).to(kl_policy.dtype)


def kto_losses(policy: torch.Tensor, ref: torch.Tensor, desirable: torch.Tensor,
               kl: torch.Tensor, avg: torch.Tensor, s: KtoSettings
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-answer losses and rewards [P]. desirable: [P] bool; kl: scalar z; avg: mean
    token log-prob of each answer (for the ftx term)."""
    reward = policy - ref
    d = s.desirable_weight * (1 - torch.sigmoid(s.beta * (reward - kl)))
    u = s.undesirable_weight * (1 - torch.sigmoid(s.beta * (kl - reward)))
    losses = torch.where(desirable, d, u)
    if s.ftx:
        losses = losses - s.ftx * avg * desirable.to(avg.dtype)
    return losses, s.beta * reward.detach()


def kto_loss_reference(policy: float, ref: float, desirable: bool, kl_pairs: list[tuple[float,
                       float]], avg: float, s: KtoSettings) -> float:
    """One answer's loss from the paper's value function; kl_pairs: (policy, ref)
    log-probs of the batch's mismatched completions."""
    z = max(0.0, sum(p - q for p, q in kl_pairs) / len(kl_pairs))
    r = policy - ref
    sigma = 1 / (1 + math.exp(-s.beta * ((r - z) if desirable else (z - r))))
    weight = s.desirable_weight if desirable else s.undesirable_weight
    return weight - weight * sigma - (s.ftx * avg if desirable else 0.0)
