"""Fast paths equal their reference twins on CPU (fp32): varlen attention isolates packed
samples, fused modules match the originals, every checkpointing mode gives the same
gradients as none."""

from __future__ import annotations

import pytest
import torch

from tiny import build_model
from tunesmith.kernels.attention import (
    register_varlen_attention,
    row_cu_seqlens,
    varlen_attention_forward,
)
from tunesmith.kernels.fused import swap_fused_modules
from tunesmith.models.acceleration import (
    activation_offload,
    enable_checkpointing,
    use_varlen_attention,
)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_packed_row_equals_separate_samples(arch):
    model = build_model(arch).eval()
    lengths = [5, 9, 2]
    ids = torch.randint(3, 300, (1, sum(lengths)))
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    cu = torch.tensor([0, 5, 14, 16], dtype=torch.int32)
    use_varlen_attention(model)
    with torch.no_grad():
        packed = model.model(input_ids=ids, position_ids=pos, cu_seq_lens_q=cu,
                             cu_seq_lens_k=cu, max_length_q=9, max_length_k=9).last_hidden_state
        model.set_attn_implementation("sdpa")
        start = 0
        for n in lengths:
            alone = model.model(input_ids=ids[:, start:start + n]).last_hidden_state
            torch.testing.assert_close(packed[:, start:start + n], alone, rtol=1e-5, atol=1e-5)
            start += n


def test_varlen_without_boundaries_is_plain_causal_attention():
    register_varlen_attention()
    q = torch.randn(2, 4, 6, 8)
    k = torch.randn(2, 2, 6, 8)
    v = torch.randn(2, 2, 6, 8)
    out, _ = varlen_attention_forward(torch.nn.Module(), q, k, v, None, scaling=0.3)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True, scale=0.3)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)
    assert row_cu_seqlens(2, 6, torch.device("cpu")).tolist() == [0, 6, 12]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_modules_match_originals(arch):
    model = build_model(arch).eval()
    ids = torch.randint(3, 300, (2, 10))
    with torch.no_grad():
        ref = model(ids).logits
        # per layer: 2 norms + the MLP; plus the final norm
        assert swap_fused_modules(model, use_liger=False) == 2 * 3 + 1
        out = model(ids).logits
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _grads(model, ids, mode):
    enable_checkpointing(model, mode)
    model.train()
    model.zero_grad()
    with activation_offload(mode, torch.device("cpu")):
        loss = model(ids, labels=ids).loss
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("mode", ["true", "selective", "offload"])
def test_checkpointing_modes_give_same_gradients(mode):
    ids = torch.randint(3, 300, (2, 12))
    ref = _grads(build_model("llama"), ids, "false")
    got = _grads(build_model("llama"), ids, mode)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6)
