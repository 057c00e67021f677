"""DFT / EAFT token weights and label smoothing: the chunked kernel equals the plain twin,
and the twin equals the formulas written out by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tunesmith.kernels.linear_ce import (
    chunked_linear_cross_entropy,
    linear_cross_entropy_reference,
)
from tunesmith.kernels.token_weights import TokenLoss

SPECS = [TokenLoss("dft"), TokenLoss("eaft", alpha=1.0), TokenLoss("eaft", alpha=0.5),
         TokenLoss(smoothing=0.1), TokenLoss("dft", smoothing=0.2)]


def _inputs(n: int = 29, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, 16, generator=g, requires_grad=True)
    weight = torch.randn(53, 16, generator=g).mul_(0.5).requires_grad_(True)
    targets = torch.randint(0, 53, (n,), generator=g)
    return hidden, weight, targets


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_chunked_variant_equals_reference(spec):
    hidden, weight, targets = _inputs()
    ref = linear_cross_entropy_reference(hidden, weight, targets, spec)
    ref.backward()
    ref_dh, ref_dw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    out = chunked_linear_cross_entropy(hidden, weight, targets, 8, spec)
    out.backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, ref_dh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad, ref_dw, rtol=1e-5, atol=1e-6)


def test_reference_variants_follow_the_formulas():
    hidden, weight, targets = _inputs()
    logits = (hidden @ weight.t()).detach()
    ce = F.cross_entropy(logits, targets, reduction="none")
    p = torch.exp(-ce)
    dft = linear_cross_entropy_reference(hidden, weight, targets, TokenLoss("dft"))
    torch.testing.assert_close(dft, (ce * p).sum())
    top = torch.topk(logits, 20, dim=-1).values.log_softmax(-1)
    entropy = -(top.exp() * top).sum(-1)
    eaft = linear_cross_entropy_reference(hidden, weight, targets, TokenLoss("eaft", 2.0))
    torch.testing.assert_close(eaft, (ce * (entropy / 3.0) ** 2).sum())
    smooth = linear_cross_entropy_reference(hidden, weight, targets, TokenLoss(smoothing=0.1))
    torch_smooth = F.cross_entropy(logits, targets, reduction="sum", label_smoothing=0.1)
    torch.testing.assert_close(smooth, torch_smooth)


def test_dft_weight_carries_no_gradient():
    """d/dz [CE * stop_grad(p)] = p * (softmax - onehot): the weight is a constant."""
    hidden, weight, targets = _inputs(n=1)
    loss = linear_cross_entropy_reference(hidden, weight, targets, TokenLoss("dft"))
    loss.backward()
    logits = (hidden @ weight.t()).detach()[0]
    p = logits.softmax(-1)
    grad_logits = p.clone()
    grad_logits[targets[0]] -= 1.0
    expected = p[targets[0]] * (grad_logits @ weight.detach())
    torch.testing.assert_close(hidden.grad[0], expected, rtol=1e-5, atol=1e-6)
    assert math.isfinite(loss.item())


def test_anchored_kl_chunked_equals_reference_and_vanishes_at_the_reference():
    from tunesmith.kernels.anchored_kl import anchored_kl_reference, chunked_anchored_kl

    hidden, weight, _ = _inputs()
    g = torch.Generator().manual_seed(5)
    ref_hidden = hidden.detach() + 0.3 * torch.randn(hidden.shape, generator=g)
    ref_weight = weight.detach().clone()
    ref = anchored_kl_reference(hidden, weight, ref_hidden, ref_weight)
    ref.backward()
    ref_dh, ref_dw = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    out = chunked_anchored_kl(hidden, weight, ref_hidden, ref_weight, 8)
    out.backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden.grad, ref_dh, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(weight.grad, ref_dw, rtol=1e-5, atol=1e-6)
    same = chunked_anchored_kl(hidden, weight, hidden.detach(), weight.detach(), 8)
    assert abs(float(same)) < 1e-4 and float(ref) > 1e-3


def test_asft_objective_adds_the_anchor_only_once_the_model_moves():
    from tiny import build_model
    from tunesmith.config import load_config
    from tunesmith.data.batching import collate
    from tunesmith.data.encode import EncodedSample
    from tunesmith.train.run_setup import build_objective

    model = build_model()
    cfg = load_config(overrides={"use_asft_loss": True, "asft_alpha": 0.5})
    asft = build_objective(cfg, model)
    dft = build_objective(load_config(overrides={"use_dft_loss": True}), model)
    import numpy as np

    ids = np.arange(3, 19, dtype=np.int32)
    labels = ids.copy()
    labels[:4] = -100  # prompt tokens are not trained
    batch = collate([EncodedSample(ids, labels)], 0)
    torch.testing.assert_close(asft.loss_sum(model, batch), dft.loss_sum(model, batch))
    with torch.no_grad():
        model.lm_head.weight.mul_(1.5)
    assert float(asft.loss_sum(model, batch)) > float(dft.loss_sum(model, batch)) + 1e-4
