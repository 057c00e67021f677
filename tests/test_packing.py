"""Packing: best-fit decreasing plans, packed batch fields, and packed == unpacked."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tunesmith.data.batching import collate, collate_packed, epoch_batches
from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.data.packing import PackedRow, PackedSamples, pack_best_fit_decreasing
from tunesmith.train.objective import NextTokenObjective


def test_best_fit_decreasing_fills_rows():
    lengths = np.array([6, 5, 4, 3, 2, 2, 1, 1])  # 24 tokens: three full rows of 8
    rows = pack_best_fit_decreasing(lengths, 8)
    assert sorted(i for r in rows for i in r) == list(range(8))
    assert all(lengths[r].sum() <= 8 for r in rows)
    assert len(rows) == 3


def test_best_fit_picks_the_tightest_row():
    # after 7 and 5 are placed, a 3 fits both rows; best fit puts it with the 5 (8 left -> 0)
    rows = pack_best_fit_decreasing(np.array([7, 5, 3, 1]), 8)
    assert sorted(sorted(r) for r in rows) == [[0, 3], [1, 2]]


def test_too_long_sample_is_refused():
    with pytest.raises(ValueError, match="more than the row size"):
        pack_best_fit_decreasing(np.array([9]), 8)


def _sample(rng, n, vocab=384):
    ids = rng.integers(3, vocab, n).astype(np.int32)
    labels = ids.copy()
    labels[: n // 2] = IGNORE_INDEX  # a prompt half that is not trained
    return EncodedSample(ids, labels)


def test_packed_batch_fields():
    rng = np.random.default_rng(0)
    a, b, c = _sample(rng, 4), _sample(rng, 3), _sample(rng, 5)
    batch = collate_packed([PackedRow([a, b]), PackedRow([c])], pad_id=0)
    assert batch.input_ids.shape == (2, 7)
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 0, 1, 2]
    assert batch.segment_ids[0].tolist() == [1, 1, 1, 1, 2, 2, 2]
    assert batch.segment_ids[1].tolist() == [1, 1, 1, 1, 1, 0, 0]
    assert batch.cu_seqlens.dtype == torch.int32
    assert batch.cu_seqlens.tolist() == [0, 4, 7, 12, 14]  # row 2's padding is a segment
    assert batch.max_seqlen == 5
    # no target crosses from sample a's last token (flat 3) into sample b
    assert 3 not in batch.target_index.tolist()
    unpacked = collate([a, b, c], pad_id=0)
    assert batch.n_targets == unpacked.n_targets
    assert sorted(batch.target_ids.tolist()) == sorted(unpacked.target_ids.tolist())


@pytest.mark.parametrize("arch,attn", [("llama", "sdpa"), ("qwen2", "sdpa"),
                                       ("llama", "eager")])
def test_packed_equals_unpacked_loss_and_grads(arch, attn):
    from tiny import build_model

    rng = np.random.default_rng(1)
    samples = [_sample(rng, n) for n in (9, 5, 7, 3, 12, 4)]
    packed = PackedSamples(samples, np.array([len(s) for s in samples]), 16)
    assert len(packed) < len(samples)
    objective = NextTokenObjective("reference")

    def loss_and_grads(batch):
        model = build_model(arch, seed=3)
        model.set_attn_implementation(attn)
        loss = objective.loss_sum(model, batch) / batch.n_targets
        loss.backward()
        return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    loss_u, grads_u = loss_and_grads(collate(samples, pad_id=0))
    loss_p, grads_p = loss_and_grads(collate([packed[i] for i in range(len(packed))], 0))
    assert torch.allclose(loss_u, loss_p, atol=1e-5, rtol=0)
    for name, g in grads_u.items():
        assert torch.allclose(g, grads_p[name], atol=1e-5, rtol=1e-4), name
    # the same samples without the block mask attend across samples: the test can fail
    leaky = collate([packed[i] for i in range(len(packed))], 0)
    leaky.segment_ids = (leaky.segment_ids > 0).long()
    loss_leak, _ = loss_and_grads(leaky)
    assert not torch.allclose(loss_u, loss_leak, atol=1e-4)


def test_token_budget_batches_are_a_pure_function_of_seed_and_epoch():
    lengths = np.random.default_rng(0).integers(5, 200, 300)
    plan = epoch_batches(300, 4, epoch=1, seed=7, lengths=lengths, batch_tokens=512)
    assert plan == epoch_batches(300, 4, epoch=1, seed=7, lengths=lengths, batch_tokens=512)
    assert plan != epoch_batches(300, 4, epoch=2, seed=7, lengths=lengths, batch_tokens=512)
    assert sorted(i for b in plan for i in b) == list(range(300))
    for b in plan:
        assert len(b) == 1 or len(b) * lengths[b].max() <= 512
    counts = {len(epoch_batches(300, 4, e, 7, lengths, 512)) for e in range(4)}
    assert len(counts) == 1  # steps per epoch do not change between epochs
