"""Linear layer + cross-entropy without materialising the full logits.

    hidden [N, H] --(chunk of C rows)--> logits [C, V] --> loss, dlogits --> dhidden, dW
                    (freed before the next chunk)

Gradients are computed during the forward pass, chunk by chunk, and kept for backward,
so peak memory is one chunk of logits ([C, V] fp32) instead of [N, V]. The loss returned
is the *sum* over rows; callers divide by the token count of the whole optimizer step.
"""

from __future__ import annotations

import torch

from tunesmith.kernels.token_weights import TokenLoss, row_losses_reference, row_weights

PLAIN = TokenLoss()


def linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor,
                                   targets: torch.Tensor, spec: TokenLoss = PLAIN
                                   ) -> torch.Tensor:
    """Plain path: full logits, then cross-entropy (sum over rows).

    Args:
        hidden: [N, H] final hidden states of the rows that have a target.
        weight: [V, H] output projection.
        targets: [N] token ids.
        spec: loss variant (DFT / EAFT weights, label smoothing); plain CE by default.
    """
    logits = (hidden @ weight.t()).float()  # [N, V]
    return row_losses_reference(logits, targets, spec).sum()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_size: int, spec: TokenLoss = PLAIN) -> torch.Tensor:
        n = hidden.shape[0]
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.empty_like(hidden) if need_dh else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32,
                                  device=weight.device) if need_dw else None
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_size):
            h = hidden[start:start + chunk_size]  # [C, H]
            t = targets[start:start + chunk_size].long()  # [C]
            logits = (h @ weight.t()).float()  # [C, V]
            lse = torch.logsumexp(logits, dim=-1)  # [C]
            eps = spec.smoothing
            rows = (1.0 - eps) * (lse - logits.gather(1, t[:, None]).squeeze(1))  # [C]
            if eps:
                rows = rows + eps * (lse - logits.mean(dim=-1))
            w = row_weights(logits, lse, t, spec)  # [C] or None, no gradient
            total += (rows * w).sum() if w is not None else rows.sum()
            if need_dh or need_dw:
                # d(row loss)/d logits = w * (softmax - (1 - eps) onehot - eps / V),
                # computed in place on the chunk
                grad_logits = logits.sub_(lse[:, None]).exp_()
                grad_logits[torch.arange(len(t), device=t.device), t] -= 1.0 - eps
                if eps:
                    grad_logits -= eps / logits.shape[1]
                if w is not None:
                    grad_logits *= w[:, None]
                g = grad_logits.to(hidden.dtype)
                if need_dh:
                    grad_hidden[start:start + chunk_size] = g @ weight
                if need_dw:
                    grad_weight += grad_logits.t() @ h.float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        return total

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        dh = grad_hidden * grad_output.to(grad_hidden.dtype) if grad_hidden is not None else None
        dw = None
        if grad_weight is not None:
            dw = (grad_weight * grad_output).to(ctx.weight_dtype)
        return dh, dw, None, None, None


def chunked_linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor,
                                 targets: torch.Tensor, chunk_size: int = 1024,
                                 spec: TokenLoss = PLAIN) -> torch.Tensor:
    """Sum of cross-entropy over rows of `hidden @ weight.T`, computed in row chunks.

    Args:
        hidden: [N, H]; weight: [V, H]; targets: [N]. Rows without a target must already
            be removed (they cost nothing then).
        chunk_size: rows per chunk; peak extra memory is chunk_size x V fp32.
        spec: loss variant (DFT / EAFT weights, label smoothing); plain CE by default.
    """
    if hidden.shape[0] == 0:
        return hidden.sum() * 0.0 + weight.sum() * 0.0
    return _ChunkedLinearCrossEntropyWithDtype.apply(hidden, weight, targets, chunk_size, spec)


class _ChunkedLinearCrossEntropyWithDtype(_ChunkedLinearCrossEntropy):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk_size, spec=PLAIN):  # type: ignore[override]
        ctx.weight_dtype = weight.dtype
        return _ChunkedLinearCrossEntropy.forward(ctx, hidden, weight, targets, chunk_size, spec)
