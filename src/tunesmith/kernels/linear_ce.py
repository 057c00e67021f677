"""Linear layer + cross-entropy without materialising the full logits.

    hidden [N, H] --(chunk of C rows)--> logits [C, V] --> loss, dlogits --> dhidden, dW
                    (freed before the next chunk)

Gradients are computed during the forward pass, chunk by chunk, and kept for backward,
so peak memory is one chunk of logits ([C, V] fp32) instead of [N, V]. The loss returned
is the *sum* over rows; callers divide by the token count of the whole optimizer step.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from tunesmith.kernels.token_weights import TokenLoss, row_losses_reference, row_weights

PLAIN = TokenLoss()
log = logging.getLogger(__name__)

# Plain chunks (no loss variant, output head frozen) can run their element-wise part as one
# compiled kernel pair (a row reduction, then the gradient) instead of eight eager passes
# over the [C, V] fp32 logits; apply_speed_settings turns it on where layers are compiled.
_COMPILED: dict[str, Any] = {"on": False, "fn": None}


def use_compiled_loss(on: bool) -> None:
    _COMPILED["on"] = on


def compiled_loss_on() -> bool:
    """Whether plain loss chunks run compiled (off again after a compile failure)."""
    return bool(_COMPILED["on"])


def plain_chunk(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed cross-entropy, d loss / d logits in the logits' dtype) of one chunk: logits
    [C, V] (any float dtype, computed in fp32), targets [C] (int64)."""
    x = logits.float()
    lse = torch.logsumexp(x, dim=-1)  # [C]
    picked = x.gather(1, targets[:, None]).squeeze(1)
    vocab = torch.arange(x.shape[1], device=x.device)
    grad = torch.exp(x - lse[:, None]) - (vocab[None, :] == targets[:, None]).to(x.dtype)
    return (lse - picked).sum(), grad.to(logits.dtype)


def _run_plain_chunk(logits: torch.Tensor, targets: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """plain_chunk, compiled when turned on; a compile failure turns it off (one warning)."""
    if not _COMPILED["on"]:
        return plain_chunk(logits, targets)
    if _COMPILED["fn"] is None:
        _COMPILED["fn"] = torch.compile(plain_chunk)
    try:
        # the row count varies (the last chunk of a batch), the vocabulary does not: a
        # static vocabulary lets inductor pick the reduction's block sizes for it
        torch._dynamo.maybe_mark_dynamic(logits, 0)
        torch._dynamo.maybe_mark_dynamic(targets, 0)
        return _COMPILED["fn"](logits, targets)
    except Exception as exc:  # noqa: BLE001 - any compile failure: the eager twin is exact
        log.warning("the compiled loss chunk failed (%s: %s); the loss runs eagerly",
                    type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
        _COMPILED["on"] = False
        return plain_chunk(logits, targets)


def add_weight_grad(acc: torch.Tensor, dlogits: torch.Tensor, h: torch.Tensor) -> None:
    """acc [V, H] fp32 += dlogits^T @ h, the GEMM in h's dtype: bf16/fp16 tensor cores with
    fp32 accumulation inside, whether or not autocast is on. DeepSpeed runs the model in
    bf16 with autocast off, where an fp32 GEMM here took 11 ms per 1,024-row chunk of a
    152k vocabulary (SIMT, no tensor cores) against ~0.7 ms. fp32 when h is fp32."""
    acc += (dlogits.to(h.dtype).t() @ h).float()


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
        fast = spec.plain and need_dh and not need_dw
        for start in range(0, n, chunk_size):
            h = hidden[start:start + chunk_size]  # [C, H]
            t = targets[start:start + chunk_size].long()  # [C]
            if fast:  # the common case: LoRA / frozen head, plain cross-entropy
                loss, g = _run_plain_chunk(h @ weight.t(), t)
                total += loss
                grad_hidden[start:start + chunk_size] = g.to(hidden.dtype) @ weight
                continue
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
                    add_weight_grad(grad_weight, g, h)
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
