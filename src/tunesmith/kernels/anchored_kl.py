"""KL(q_ref || p) summed over rows, without materialising either model's full logits:
ASFT's anchor term (Anchored SFT: DFT plus a KL pull towards the reference model).

    per row i:  KL_i = sum_v q_v (log q_v - log p_v),   d KL_i / d z_v = p_v - q_v
    (z: policy logits; q: the frozen reference model's softmax)

Gradients are computed chunk by chunk in the forward pass, as in linear_ce.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tunesmith.kernels.linear_ce import add_weight_grad


def anchored_kl_reference(hidden: torch.Tensor, weight: torch.Tensor, ref_hidden: torch.Tensor,
                          ref_weight: torch.Tensor) -> torch.Tensor:
    """Plain twin: full logits of both models. hidden, ref_hidden: [N, H]; weights [V, H]."""
    log_p = F.log_softmax((hidden @ weight.t()).float(), dim=-1)
    q = F.softmax((ref_hidden @ ref_weight.t()).float(), dim=-1)
    return F.kl_div(log_p, q, reduction="sum")


class _ChunkedAnchoredKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, ref_hidden, ref_weight, chunk_size):
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_dh else None
        grad_weight = (torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
                       if need_dw else None)
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, hidden.shape[0], chunk_size):
            h = hidden[start:start + chunk_size]  # [C, H]
            log_p = F.log_softmax((h @ weight.t()).float(), dim=-1)  # [C, V]
            log_q = F.log_softmax((ref_hidden[start:start + chunk_size]
                                   @ ref_weight.t()).float(), dim=-1)
            q = log_q.exp()
            total += (q * (log_q - log_p)).sum()
            grad_logits = log_p.exp_().sub_(q)  # p - q, in place
            if need_dh:
                grad_hidden[start:start + chunk_size] = grad_logits.to(hidden.dtype) @ weight
            if need_dw:
                add_weight_grad(grad_weight, grad_logits, h)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_output):
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = grad_hidden * grad_output.to(grad_hidden.dtype) if grad_hidden is not None else None
        dw = (grad_weight * grad_output).to(ctx.weight_dtype) if grad_weight is not None else None
        return dh, dw, None, None, None


def chunked_anchored_kl(hidden: torch.Tensor, weight: torch.Tensor, ref_hidden: torch.Tensor,
                        ref_weight: torch.Tensor, chunk_size: int = 1024) -> torch.Tensor:
    """Sum over rows of KL(softmax(ref_hidden @ ref_weight.T) || softmax(hidden @ weight.T)).
    The reference side carries no gradient."""
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0 + weight.sum() * 0.0
    return _ChunkedAnchoredKL.apply(hidden, weight, ref_hidden.detach(), ref_weight.detach(),
                                    chunk_size)
