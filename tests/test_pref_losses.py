"""Preference losses against hand-computed values and their reference twins (the papers'
formulas, one pair at a time); chunked token log-probs against full logits."""

from __future__ import annotations

import math

import pytest
import torch

from tunesmith.kernels.linear_logprob import chunked_token_logprobs, token_logprobs_reference
from tunesmith.train.objectives.kto import KtoSettings, kto_kl, kto_loss_reference, kto_losses
from tunesmith.train.objectives.preference import (
    PairLossSettings,
    pair_loss_reference,
    pair_losses,
)
from tunesmith.train.objectives.reward import pairwise_loss_reference, pairwise_losses

T = torch.tensor
# policy chosen/rejected, reference chosen/rejected log-probs (sums), chosen mean log-prob
PC, PR, RC, RR, AVG = -10.0, -14.0, -11.0, -12.0, -0.5


def _loss(s: PairLossSettings, pc=PC, pr=PR, rc=RC, rr=RR) -> tuple[float, float, float]:
    ref = (T([rc]), T([rr])) if s.uses_reference else (None, None)
    loss, rew_c, rew_r = pair_losses(T([pc]), T([pr]), *ref, T([AVG]), s)
    return float(loss), float(rew_c), float(rew_r)


def test_dpo_sigmoid_by_hand():
    # h = (-10 + 11) - (-14 + 12) = 3; beta h = 0.3; -log sigmoid(0.3) = log(1 + e^-0.3)
    loss, rc, rr = _loss(PairLossSettings("sigmoid", beta=0.1))
    assert loss == pytest.approx(math.log(1 + math.exp(-0.3)), abs=1e-6)
    assert (rc, rr) == (pytest.approx(0.1), pytest.approx(-0.2))


def test_cdpo_mixes_flipped_labels_by_hand():
    loss, _, _ = _loss(PairLossSettings("sigmoid", beta=0.1, label_smoothing=0.2))
    want = 0.8 * math.log(1 + math.exp(-0.3)) + 0.2 * math.log(1 + math.exp(0.3))
    assert loss == pytest.approx(want, abs=1e-6)


def test_hinge_and_ipo_by_hand():
    assert _loss(PairLossSettings("hinge", beta=0.1))[0] == pytest.approx(0.7, abs=1e-6)
    assert _loss(PairLossSettings("hinge", beta=0.5))[0] == 0.0  # margin past 1/beta
    # IPO on (here already averaged) log-probs: (h - 1/(2 beta))^2 = (3 - 5)^2
    assert _loss(PairLossSettings("ipo", beta=0.1))[0] == pytest.approx(4.0, abs=1e-5)


def test_orpo_and_simpo_by_hand():
    pc, pr = math.log(0.5), math.log(0.2)  # average token probabilities 0.5 and 0.2
    # odds 1 and 0.25: log odds ratio log 4; loss = -log 0.5 - beta log sigmoid(log 4)
    loss, rc, _ = _loss(PairLossSettings("orpo", beta=0.1), pc=pc, pr=pr)
    assert loss == pytest.approx(math.log(2) - 0.1 * math.log(0.8), abs=1e-6)
    assert rc == pytest.approx(0.1 * pc)
    # SimPO: -log sigmoid(beta (pc - pr) - gamma) = -log sigmoid(2 * 1.5 - 1)
    loss, _, _ = _loss(PairLossSettings("simpo", beta=2.0, simpo_gamma=1.0), pc=-1.0, pr=-2.5)
    assert loss == pytest.approx(math.log(1 + math.exp(-2.0)), abs=1e-6)


def test_ftx_adds_the_chosen_answers_nll():
    base = _loss(PairLossSettings("sigmoid"))[0]
    assert _loss(PairLossSettings("sigmoid", ftx=2.0))[0] == pytest.approx(base + 1.0, abs=1e-6)


@pytest.mark.parametrize("kind", ["sigmoid", "hinge", "ipo", "orpo", "simpo"])
def test_every_loss_equals_its_twin(kind):
    g = torch.Generator().manual_seed(0)
    n = 32
    pc, pr = -torch.rand(n, generator=g) * 3 - 0.05, -torch.rand(n, generator=g) * 3 - 0.05
    rc, rr = pc + torch.randn(n, generator=g), pr + torch.randn(n, generator=g)
    avg = -torch.rand(n, generator=g)
    s = PairLossSettings(kind, beta=0.3, label_smoothing=0.1 if kind == "sigmoid" else 0.0,
                         simpo_gamma=0.4, ftx=0.5)
    losses, _, _ = pair_losses(pc, pr, rc, rr, avg, s)
    twin = [pair_loss_reference(*map(float, (pc[i], pr[i], rc[i], rr[i], avg[i])), s)
            for i in range(n)]
    torch.testing.assert_close(losses, T(twin), atol=1e-5, rtol=1e-5)


def test_kto_by_hand_and_twin():
    s = KtoSettings(beta=0.5, desirable_weight=1.0, undesirable_weight=2.0, ftx=0.0)
    policy, ref = T([-3.0, -4.0]), T([-4.0, -3.0])  # rewards +1 and -1
    kl_policy, kl_ref = T([-6.0, -7.0]), T([-6.5, -7.5])  # KL estimate z = 0.5
    z = kto_kl(kl_policy, kl_ref)
    assert float(z) == pytest.approx(0.5)
    desirable = T([True, False])
    losses, rewards = kto_losses(policy, ref, desirable, z, T([-1.0, -1.0]), s)
    sig = 1 / (1 + math.exp(-0.25))  # sigmoid(0.5 * (1 - 0.5)) and sigmoid(0.5 * (0.5 + 1))
    assert float(losses[0]) == pytest.approx(1 - sig, abs=1e-6)
    assert float(losses[1]) == pytest.approx(2 * (1 - 1 / (1 + math.exp(-0.75))), abs=1e-6)
    assert rewards.tolist() == pytest.approx([0.5, -0.5])
    pairs = list(zip(kl_policy.tolist(), kl_ref.tolist(), strict=True))
    for i in range(2):
        twin = kto_loss_reference(float(policy[i]), float(ref[i]), bool(desirable[i]), pairs,
                                  -1.0, s)
        assert float(losses[i]) == pytest.approx(twin, abs=1e-6)
    # the KL estimate is clamped at zero and never differentiated through
    assert float(kto_kl(T([-5.0]), T([-4.0]))) == 0.0
    with_ftx = kto_losses(policy, ref, desirable, z, T([-1.0, -1.0]), KtoSettings(0.5, 1, 2, 3))
    assert (with_ftx[0] - losses).tolist() == pytest.approx([3.0, 0.0])


def test_reward_pairwise_loss_by_hand_and_twin():
    losses = pairwise_losses(T([2.0, -1.0]), T([1.0, 1.0]))
    assert losses.tolist() == pytest.approx([math.log(1 + math.exp(-1)),
                                             math.log(1 + math.exp(2))], abs=1e-6)
    assert float(losses[1]) == pytest.approx(pairwise_loss_reference(-1.0, 1.0), abs=1e-6)


def test_chunked_token_logprobs_match_full_logits_with_gradients():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(37, 16, generator=g, requires_grad=True)
    weight = torch.randn(50, 16, generator=g, requires_grad=True)
    targets = torch.randint(0, 50, (37,), generator=g)
    upstream = torch.randn(37, generator=g)
    fast = chunked_token_logprobs(hidden, weight, targets, chunk_size=8)  # 5 chunks, tail 5
    (fast * upstream).sum().backward()
    grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    ref = token_logprobs_reference(hidden, weight, targets)
    (ref * upstream).sum().backward()
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[0], hidden.grad, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(grads[1], weight.grad, atol=1e-5, rtol=1e-5)
