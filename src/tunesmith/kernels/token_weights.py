"""Token-loss variants of LLaMA-Factory's extras, as per-row weights and label smoothing.

Each variant scales a row's cross-entropy by a weight computed from the row's own logits
and held constant (no gradient flows through it):

    dft:   w = p(target)                                  (Dynamic Fine-Tuning, Wu et al.
                                                           2025: SFT reweighted by the
                                                           token probability)
    eaft:  w = (H_top20 / 3) ** alpha                     (entropy-adaptive fine-tuning:
                                                           H over the 20 largest logits,
                                                           renormalised; ln 20 ~ 3)
    label smoothing eps: loss = (1 - eps) * CE + eps * mean_v(-log p_v)   (as HF's)

`row_losses_reference` is the plain twin the chunked kernel is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

Weighting = Literal["none", "dft", "eaft"]
EAFT_TOP_K = 20
EAFT_SCALE = 3.0  # about ln(20), the largest entropy over 20 tokens


@dataclass(frozen=True)
class TokenLoss:
    """How each trained token's cross-entropy is formed."""

    weighting: Weighting = "none"
    alpha: float = 1.0  # eaft: power of the entropy weight
    smoothing: float = 0.0  # label_smoothing_factor

    @property
    def plain(self) -> bool:
        return self.weighting == "none" and self.smoothing == 0.0


@torch.no_grad()
def row_weights(logits: torch.Tensor, lse: torch.Tensor, targets: torch.Tensor,
                spec: TokenLoss) -> torch.Tensor | None:
    """Detached weights [C] of rows with fp32 `logits` [C, V] and their logsumexp [C]."""
    if spec.weighting == "dft":
        return (logits.gather(1, targets[:, None]).squeeze(1) - lse).exp()
    if spec.weighting == "eaft":
        top = torch.topk(logits, k=min(EAFT_TOP_K, logits.shape[1]), dim=-1).values
        logp = top - torch.logsumexp(top, dim=-1, keepdim=True)
        entropy = -(logp.exp() * logp).sum(dim=-1)
        return (entropy / EAFT_SCALE).pow(spec.alpha)
    return None


def row_losses_reference(logits: torch.Tensor, targets: torch.Tensor, spec: TokenLoss
                         ) -> torch.Tensor:
    """Plain path: per-row losses [C] from full fp32 logits [C, V]."""
    nll = F.cross_entropy(logits, targets.long(), reduction="none")
    if spec.smoothing:
        smooth = -F.log_softmax(logits, dim=-1).mean(dim=-1)
        nll = (1.0 - spec.smoothing) * nll + spec.smoothing * smooth
    w = row_weights(logits.detach(), torch.logsumexp(logits.detach(), dim=-1), targets.long(),
                    spec)
    return nll if w is None else nll * w
