"""The compiled loss chunk on a GPU equals its eager twin (bf16 logits, fp32 math)."""

from __future__ import annotations

import pytest
import torch

from tunesmith.kernels import linear_ce

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_compiled_chunk_equals_eager(monkeypatch):
    monkeypatch.setitem(linear_ce._COMPILED, "fn", None)
    linear_ce.use_compiled_loss(True)
    try:
        g = torch.Generator("cuda").manual_seed(0)
        hidden = torch.randn(3000, 256, device="cuda", dtype=torch.bfloat16, generator=g,
                             requires_grad=True)
        weight = torch.randn(32000, 256, device="cuda", dtype=torch.bfloat16, generator=g) * 0.05
        targets = torch.randint(0, 32000, (3000,), device="cuda", generator=g)
        out = linear_ce.chunked_linear_cross_entropy(hidden, weight, targets, 1024)
        out.backward()
        assert linear_ce.compiled_loss_on() and linear_ce._COMPILED["fn"] is not None
        linear_ce.use_compiled_loss(False)
        ref_hidden = hidden.detach().clone().requires_grad_()
        ref = linear_ce.chunked_linear_cross_entropy(ref_hidden, weight, targets, 1024)
        ref.backward()
        torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-2)
        torch.testing.assert_close(hidden.grad, ref_hidden.grad, rtol=2e-2, atol=1e-3)
    finally:
        linear_ce.use_compiled_loss(False)
