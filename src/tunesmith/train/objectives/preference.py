"""Pairwise preference losses: DPO (sigmoid), hinge, IPO, conservative DPO, ORPO, SimPO,
plus the optional SFT term (`pref_ftx`). Vectorised over pairs; `pair_loss_reference`
is the twin written term by term from the papers, one pair at a time.

Inputs are completion log-probabilities: sums over the answer's tokens for sigmoid and
hinge, per-token averages for ipo, orpo and simpo (`uses_average`). With a reference
model, h = (pi_c - ref_c) - (pi_r - ref_r) is the implicit reward margin.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

NO_REFERENCE = ("orpo", "simpo")


@dataclass(frozen=True)
class PairLossSettings:
    loss: str = "sigmoid"  # sigmoid | hinge | ipo | orpo | simpo
    beta: float = 0.1
    label_smoothing: float = 0.0  # cDPO epsilon (sigmoid only)
    simpo_gamma: float = 0.5
    ftx: float = 0.0  # weight of -mean log p(chosen token)

    @property
    def uses_reference(self) -> bool:
        return self.loss not in NO_REFERENCE

    @property
    def uses_average(self) -> bool:
        return self.loss in ("ipo", "orpo", "simpo")


def pair_losses(pc: torch.Tensor, pr: torch.Tensor, rc: torch.Tensor | None,
                rr: torch.Tensor | None, chosen_avg: torch.Tensor, s: PairLossSettings
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair losses and the implicit rewards (chosen, rejected), all [P].

    pc, pr: policy log-probs of chosen / rejected; rc, rr: the reference's (None for orpo
    and simpo); chosen_avg: policy's mean token log-prob of the chosen answer (ftx term)."""
    b = s.beta
    if s.loss == "orpo":
        log_odds = (pc - pr) - (torch.log1p(-pc.exp()) - torch.log1p(-pr.exp()))
        losses = -pc - b * F.logsigmoid(log_odds)
        reward_c, reward_r = b * pc.detach(), b * pr.detach()
    elif s.loss == "simpo":
        losses = -F.logsigmoid(b * (pc - pr) - s.simpo_gamma)
        reward_c, reward_r = b * pc.detach(), b * pr.detach()
    else:
        assert rc is not None and rr is not None, "this loss needs reference log-probs"
        margin = (pc - rc) - (pr - rr)
        if s.loss == "sigmoid":
            eps = s.label_smoothing
            losses = -(1 - eps) * F.logsigmoid(b * margin) - eps * F.logsigmoid(-b * margin)
        elif s.loss == "hinge":
            losses = torch.relu(1 - b * margin)
        elif s.loss == "ipo":
            losses = (margin - 1 / (2 * b)) ** 2
        else:
            raise ValueError(f"unknown preference loss {s.loss!r}")
        reward_c, reward_r = b * (pc - rc).detach(), b * (pr - rr).detach()
    if s.ftx:
        losses = losses - s.ftx * chosen_avg
    return losses, reward_c, reward_r


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x >= 0 else x - math.log1p(math.exp(x))


def pair_loss_reference(pc: float, pr: float, rc: float | None, rr: float | None,
                        chosen_avg: float, s: PairLossSettings) -> float:
    """One pair's loss, written from each paper's formula (the twin of `pair_losses`)."""
    b = s.beta
    if s.loss == "orpo":  # Hong et al. 2024: L_SFT + lambda * L_OR, odds = p / (1 - p)
        odds_c = math.exp(pc) / (1 - math.exp(pc))
        odds_r = math.exp(pr) / (1 - math.exp(pr))
        loss = -pc - b * _log_sigmoid(math.log(odds_c / odds_r))
    elif s.loss == "simpo":  # Meng et al. 2024: -log sigma(beta/|y_w| log pi_w - ... - gamma)
        loss = -_log_sigmoid(b * pc - b * pr - s.simpo_gamma)
    else:
        assert rc is not None and rr is not None
        h = math.log(math.exp(pc) / math.exp(rc)) - math.log(math.exp(pr) / math.exp(rr))
        if s.loss == "sigmoid":  # Rafailov et al. 2023; cDPO (Mitchell 2023) mixes labels
            e = s.label_smoothing
            loss = -(1 - e) * _log_sigmoid(b * h) - e * _log_sigmoid(-b * h)
        elif s.loss == "hinge":  # SLiC-style hinge on the DPO margin
            loss = max(0.0, 1 - b * h)
        elif s.loss == "ipo":  # Azar et al. 2023: (h - 1 / (2 tau))^2
            loss = (h - 1 / (2 * b)) ** 2
        else:
            raise ValueError(s.loss)
    return loss - s.ftx * chosen_avg
