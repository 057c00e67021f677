"""PPO's arithmetic against hand-computed values and the plain-Python twins: per-token
rewards with the KL penalty, GAE (advantages, returns) over padded responses, whitening,
the clipped policy and value losses, the adaptive KL coefficient and score normalisation;
and the prompt taken from an encoded conversation."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.recipes.ppo import prompt_ids
from tunesmith.train.objectives.ppo import (
    AdaptiveKl,
    PpoSettings,
    RunningMoments,
    advantages_and_returns,
    gae_reference,
    masked_whiten,
    ppo_loss,
    ppo_token_loss_reference,
    token_rewards,
)

T = torch.tensor


def test_gae_by_hand():
    """rewards [0, 0, 1], values 0.5 each, gamma 1, lam 0.95:
    deltas 0, 0, 0.5 -> A = 0.45125, 0.475, 0.5; returns = A + V."""
    adv, ret = gae_reference([0.0, 0.0, 1.0], [0.5, 0.5, 0.5], 1.0, 0.95)
    assert adv == pytest.approx([0.45125, 0.475, 0.5])
    assert ret == pytest.approx([0.95125, 0.975, 1.0])
    mask = T([[1.0, 1.0, 1.0]])
    _, returns = advantages_and_returns(T([[0.5, 0.5, 0.5]]), T([[0.0, 0.0, 1.0]]), mask,
                                        PpoSettings())
    assert returns[0].tolist() == pytest.approx([0.95125, 0.975, 1.0])


def test_gae_over_padded_responses_matches_the_twin():
    """Two responses of 4 and 2 tokens; values on the padding must not leak in."""
    g = torch.Generator().manual_seed(0)
    values = torch.randn(2, 4, generator=g)  # padding holds non-zero values on purpose
    rewards = torch.randn(2, 4, generator=g)
    mask = T([[1.0, 1, 1, 1], [1, 1, 0, 0]])
    s = PpoSettings(gamma=0.9, lam=0.8)
    adv, ret = advantages_and_returns(values, rewards, mask, s)
    raw = []
    for b, n in enumerate((4, 2)):
        a, r = gae_reference(rewards[b, :n].tolist(), values[b, :n].tolist(), 0.9, 0.8)
        assert ret[b, :n].tolist() == pytest.approx(r, abs=1e-6)
        raw += a
    mean, std = np.mean(raw), np.std(raw, ddof=1)
    want = [(a - mean) / math.sqrt(std ** 2 + 1e-8) for a in raw]
    got = adv[0].tolist() + adv[1, :2].tolist()
    assert got == pytest.approx(want, abs=1e-5)


def test_token_rewards_put_the_score_on_the_last_token():
    logp = T([[-1.0, -2.0, -3.0], [-1.0, -1.0, 0.0]])
    ref = T([[-1.5, -2.0, -2.0], [-2.0, -1.0, 0.0]])
    mask = T([[1.0, 1, 1], [1, 1, 0]])
    rewards, kl = token_rewards(logp, ref, T([2.0, -1.0]), mask, kl_coef=0.1)
    assert kl.flatten().tolist() == pytest.approx([0.5, 0.0, -1.0, 1.0, 0.0, 0.0])
    assert rewards.flatten().tolist() == pytest.approx([-0.05, 0.0, 0.1 + 2.0,
                                                        -0.1, -1.0, 0.0])


def test_whitened_rewards_keep_their_mean():
    x, mask = T([[1.0, 2.0, 3.0, 9.0]]), T([[1.0, 1.0, 1.0, 0.0]])
    out = masked_whiten(x, mask, shift_mean=False)
    assert out[0, :3].tolist() == pytest.approx([1.0, 2.0, 3.0], abs=1e-4)  # var 1: unchanged
    s = PpoSettings(whiten_rewards=True)
    rewards = T([[0.0, 0.0, 4.0]])
    _, ret_w = advantages_and_returns(torch.zeros(1, 3), rewards, torch.ones(1, 3), s)
    w = masked_whiten(rewards, torch.ones(1, 3), shift_mean=False)[0].tolist()
    _, want = gae_reference(w, [0.0] * 3, 1.0, 0.95)
    assert ret_w[0].tolist() == pytest.approx(want, abs=1e-5)


def test_clipped_losses_match_the_twin_token_by_token():
    s = PpoSettings(cliprange=0.2, cliprange_value=0.2, vf_coef=0.1)
    old = T([[-1.0, -1.0, -1.0, -1.0, -1.0]])
    logp = T([[-0.5, -1.5, -1.0, -0.9, -2.0]])  # ratios 1.65, 0.61, 1, 1.11, 0.37
    adv = T([[1.0, -1.0, 0.5, -2.0, 1.0]])
    old_v, vpred = T([[0.0, 0.0, 1.0, 0.0, 0.0]]), T([[0.5, -0.1, 1.0, 0.3, 0.0]])
    ret = T([[1.0, 1.0, 0.0, -1.0, 0.5]])
    mask = T([[1.0, 1, 1, 1, 0]])  # the last token is padding
    loss, stats = ppo_loss(logp, vpred, old, old_v, adv, ret, mask, s)
    terms = [ppo_token_loss_reference(*(float(x[0, t]) for x in (logp, old, vpred, old_v, adv,
                                                                  ret)), s) for t in range(4)]
    pg = sum(p for p, _ in terms) / 4
    vf = sum(v for _, v in terms) / 4
    assert float(stats["policy_loss"]) == pytest.approx(pg, abs=1e-6)
    assert float(stats["value_loss"]) == pytest.approx(vf, abs=1e-6)
    assert float(loss) == pytest.approx(pg + 0.1 * vf, abs=1e-6)
    assert float(stats["clipfrac"]) == pytest.approx(0.5)  # tokens 0 and 1 are clipped
    # by hand: token 0 (A=1, ratio e^0.5): the clipped term -1.2 wins the max
    assert terms[0][0] == pytest.approx(-1.2)
    # token 1 (A=-1, ratio e^-0.5 = 0.607): max(0.607, 0.8) = 0.8
    assert terms[1][0] == pytest.approx(0.8)
    # token 3 value: vpred 0.3 clipped to 0.2; max((0.3+1)^2, (0.2+1)^2) / 2 = 0.845
    assert terms[3][1] == pytest.approx(0.845)


def test_adaptive_kl_and_score_norm():
    kl = AdaptiveKl(init=0.2, target=6.0, horizon=10000)
    kl.update(12.0, 100)  # error clipped to +0.2
    assert kl.value == pytest.approx(0.2 * (1 + 0.2 * 100 / 10000))
    kl.update(5.4, 100)  # error -0.1
    assert kl.value == pytest.approx(0.2 * 1.002 * (1 - 0.1 * 100 / 10000))
    m = RunningMoments()
    a, b = T([1.0, 2.0, 4.0]), T([0.0, 10.0])
    m.normalise(a)
    out = m.normalise(b)
    seen = [1.0, 2.0, 4.0, 0.0, 10.0]
    mean, std = np.mean(seen), np.std(seen, ddof=1)
    assert out.tolist() == pytest.approx([(x - mean) / std for x in (0.0, 10.0)], abs=1e-5)


def test_prompt_is_everything_before_the_last_answer():
    ids = np.arange(12, dtype=np.int32)
    labels = np.full(12, IGNORE_INDEX, dtype=np.int32)
    labels[3:5] = ids[3:5]  # first answer
    labels[8:11] = ids[8:11]  # last answer
    assert prompt_ids(EncodedSample(ids, labels)) == list(range(8))
