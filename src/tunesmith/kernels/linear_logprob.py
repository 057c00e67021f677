"""Token log-probabilities of `hidden @ weight.T` without materialising the full logits.

    forward:  per chunk of C rows: logits [C, V] -> log p(target) [C], logsumexp [C]
    backward: per chunk again: dlogits = g * (onehot - softmax) -> dhidden, dweight

Preference losses weigh each token's log-probability by a factor known only after the
whole sequence is summed (DPO's sigmoid of the margin), so unlike the fused cross-entropy
the gradient cannot be formed in the forward pass; the backward recomputes each chunk's
logits instead (one more matmul, no [N, V] tensor ever alive).
"""

from __future__ import annotations

import torch

from tunesmith.kernels.linear_ce import add_weight_grad


def token_logprobs_reference(hidden: torch.Tensor, weight: torch.Tensor,
                             targets: torch.Tensor) -> torch.Tensor:
    """Plain path: full logits, log-softmax, gather. hidden [N, H], weight [V, H],
    targets [N] -> [N] float32."""
    logits = (hidden @ weight.t()).float()  # [N, V]
    return logits.log_softmax(-1).gather(1, targets.long()[:, None]).squeeze(1)


class _ChunkedTokenLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_size: int) -> torch.Tensor:
        n = hidden.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_size):
            sl = slice(start, start + chunk_size)
            logits = (hidden[sl] @ weight.t()).float()  # [C, V]
            lse[sl] = torch.logsumexp(logits, dim=-1)
            out[sl] = logits.gather(1, targets[sl].long()[:, None]).squeeze(1) - lse[sl]
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        hidden, weight, targets, lse = ctx.saved_tensors
        need_dh, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dh = torch.empty_like(hidden) if need_dh else None
        dw = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if need_dw else None
        for start in range(0, hidden.shape[0], ctx.chunk_size):
            sl = slice(start, start + ctx.chunk_size)
            h, t, g = hidden[sl], targets[sl].long(), grad_out[sl].float()
            # d logp(t) / d logits = onehot(t) - softmax; times the upstream gradient
            probs = (h @ weight.t()).float().sub_(lse[sl, None]).exp_()  # [C, V]
            dlogits = probs.mul_(-g[:, None])
            dlogits[torch.arange(len(t), device=t.device), t] += g
            if need_dh:
                dh[sl] = dlogits.to(hidden.dtype) @ weight
            if need_dw:
                add_weight_grad(dw, dlogits, h)
        return dh, (dw.to(weight.dtype) if dw is not None else None), None, None


def chunked_token_logprobs(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                           chunk_size: int = 1024) -> torch.Tensor:
    """log softmax(hidden @ weight.T)[target] per row, [N] float32, in row chunks; peak
    extra memory is chunk_size x V fp32 in forward and backward."""
    if hidden.shape[0] == 0:
        return (hidden.sum() * 0.0 + weight.sum() * 0.0).float().reshape(1)[:0]
    return _ChunkedTokenLogprobs.apply(hidden, weight, targets, chunk_size)
