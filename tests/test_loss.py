"""The chunked linear cross-entropy equals the plain one, in value and gradient."""

from __future__ import annotations

import pytest
import torch

from tunesmith.kernels.linear_ce import (
    chunked_linear_cross_entropy,
    linear_cross_entropy_reference,
)


@pytest.mark.parametrize("n,chunk", [(1, 4), (37, 8), (64, 64), (100, 1000)])
@pytest.mark.parametrize("weight_grad", [True, False])
def test_chunked_equals_reference(n, chunk, weight_grad):
    g = torch.Generator().manual_seed(n)
    hidden = torch.randn(n, 32, generator=g, requires_grad=True)
    weight = torch.randn(97, 32, generator=g).mul_(0.3).requires_grad_(weight_grad)
    targets = torch.randint(0, 97, (n,), generator=g)

    ref = linear_cross_entropy_reference(hidden, weight, targets)
    (ref * 0.37).backward()
    ref_dh = hidden.grad.clone()
    ref_dw = weight.grad.clone() if weight_grad else None
    hidden.grad = None
    if weight_grad:
        weight.grad = None

    out = chunked_linear_cross_entropy(hidden, weight, targets, chunk)
    (out * 0.37).backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, ref_dh, rtol=1e-5, atol=1e-6)
    if weight_grad:
        torch.testing.assert_close(weight.grad, ref_dw, rtol=1e-5, atol=1e-6)


def test_empty_rows_give_zero_loss_and_gradients():
    hidden = torch.randn(0, 8, requires_grad=True)
    weight = torch.randn(11, 8, requires_grad=True)
    loss = chunked_linear_cross_entropy(hidden, weight, torch.zeros(0, dtype=torch.long))
    loss.backward()
    assert loss.item() == 0.0
    assert torch.count_nonzero(weight.grad) == 0


def test_compiled_chunks_fall_back_to_the_eager_twin(monkeypatch, caplog):
    from tunesmith.kernels import linear_ce

    calls = []

    def broken(logits, targets):
        calls.append(logits.shape)
        raise RuntimeError("no triton here")

    monkeypatch.setitem(linear_ce._COMPILED, "fn", broken)
    monkeypatch.setitem(linear_ce._COMPILED, "on", True)
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(20, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g)  # frozen head: the compiled path's case
    targets = torch.randint(0, 50, (20,), generator=g)
    out = chunked_linear_cross_entropy(hidden, weight, targets, 8)
    out.backward()
    assert calls  # the compiled function was tried first
    assert not linear_ce.compiled_loss_on()
    assert "the loss runs eagerly" in caplog.text
    ref_hidden = hidden.detach().clone().requires_grad_()
    ref = linear_cross_entropy_reference(ref_hidden, weight, targets)
    ref.backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, ref_hidden.grad, rtol=1e-5, atol=1e-6)


def _mm_dtypes(fn) -> list[tuple[torch.dtype, ...]]:
    """The input dtypes of every matrix product `fn` runs, forward and backward."""
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.overloadpacket in (torch.ops.aten.mm, torch.ops.aten.addmm):
                seen.append(tuple(a.dtype for a in args if isinstance(a, torch.Tensor)))
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


@pytest.mark.parametrize("kernel", ["cross_entropy", "logprobs", "anchored_kl"])
def test_head_weight_gradient_multiplies_in_the_models_dtype(kernel):
    """With a bf16 model and autocast off (DeepSpeed's bf16 mode), every product of the
    chunked head losses runs in bf16: the weight gradient's GEMM in fp32 was an untensored
    SIMT kernel (11 ms per chunk on an H200). The sum itself stays fp32, and close to the
    fp32 reference."""
    from tunesmith.kernels.anchored_kl import chunked_anchored_kl
    from tunesmith.kernels.linear_logprob import chunked_token_logprobs

    g = torch.Generator().manual_seed(0)
    h32 = torch.randn(24, 32, generator=g)
    w32 = torch.randn(97, 32, generator=g).mul_(0.3)
    targets = torch.randint(0, 97, (24,), generator=g)

    def run(dtype):
        w = w32.to(dtype).requires_grad_(True)
        h = h32.to(dtype).requires_grad_(True)
        if kernel == "cross_entropy":
            out = chunked_linear_cross_entropy(h, w, targets, 8)
        elif kernel == "logprobs":
            out = chunked_token_logprobs(h, w, targets, 8).sum()
        else:
            out = chunked_anchored_kl(h, w, h32.flip(0).to(dtype), w32.to(dtype), 8)
        out.backward()
        return w.grad

    dtypes = _mm_dtypes(lambda: run(torch.bfloat16))
    assert dtypes and all(d == torch.bfloat16 for pair in dtypes for d in pair), dtypes
    got, ref = run(torch.bfloat16).float(), run(torch.float32)
    assert (got - ref).abs().max() < 0.05 * ref.abs().max()
