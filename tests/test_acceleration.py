"""Fast paths equal their reference twins on CPU (fp32): varlen attention isolates packed
samples, fused modules match the originals, every checkpointing mode gives the same
gradients as none."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

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


def _segment_attention(q, k, v, cu_q, cu_k, max_q, max_k, **kw):
    """A stand-in for torch's varlen kernel on CPU: grouped K/V shared by their Q heads."""
    from tunesmith.kernels.attention import varlen_attention_reference

    groups = q.shape[1] // k.shape[1]
    return varlen_attention_reference(q.float(), k.float().repeat_interleave(groups, 1),
                                      v.float().repeat_interleave(groups, 1), cu_q,
                                      kw.get("scale")).to(q.dtype)


def _tiled_kv_heads(q, k, v, *a, **kw):  # mis-reads grouped K/V: Q head h takes h % Hkv
    groups = q.shape[1] // k.shape[1]
    return _segment_attention(q, k.repeat(1, groups, 1), v.repeat(1, groups, 1), *a, **kw)


def _refuses_grouped(q, k, *a, **kw):
    if q.shape[1] != k.shape[1]:
        raise RuntimeError("Expect query and key/value to have the same number of heads")
    return _segment_attention(q, k, *a, **kw)


@pytest.mark.parametrize("kernel,native", [(_segment_attention, True),
                                           (_tiled_kv_heads, False),
                                           (_refuses_grouped, False)])
def test_grouped_kv_reach_the_kernel_unexpanded_only_when_it_takes_them(monkeypatch, kernel,
                                                                       native):
    """The probe says whether the kernel takes K/V with fewer heads than Q (its answer must
    come from the results); when it does, K and V reach the kernel with their own heads (no
    expanded copies kept for backward), else expanded."""
    from tunesmith.kernels import attention

    heads_seen = []

    def recording(q, k, *a, **kw):
        heads_seen.append(k.shape[1])
        return kernel(q, k, *a, **kw)

    monkeypatch.setattr(attention, "_FLASH", {"kernel": recording,
                                              "params": frozenset({"scale", "window_size"})})
    assert attention._probe_native_gqa("cpu") is native
    attention._FLASH["native_gqa"] = native
    heads_seen.clear()
    q, k, v = torch.randn(12, 4, 8), torch.randn(12, 2, 8), torch.randn(12, 2, 8)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    out = attention._flash_varlen(q, k, v, cu, 7, 0.3)
    assert heads_seen == [2 if native else 4]
    ref = attention.varlen_attention_reference(q, k, v, cu, 0.3)
    if kernel is not _tiled_kv_heads:
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


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


class _CountOps(TorchDispatchMode):
    """Counts aten ops by name (overload dropped) while active."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


def _grads(model, ids, mode):
    """Gradients, the ops run during backward (recomputed forward ops show up there) and
    the offload context."""
    enable_checkpointing(model, mode)
    model.train()
    model.zero_grad()
    offload = activation_offload(mode, torch.device("cpu"))
    with offload:
        loss = model(ids, labels=ids).loss
    with _CountOps() as counted:
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, counted.ops, offload


SDPA_CPU = "_scaled_dot_product_flash_attention_for_cpu"


@pytest.mark.parametrize("mode", ["true", "selective", "offload"])
def test_checkpointing_modes_give_same_gradients_and_recompute(mode):
    ids = torch.randint(3, 300, (2, 12))
    ref, ref_ops, _ = _grads(build_model("llama"), ids, "false")
    got, ops, offload = _grads(build_model("llama"), ids, mode)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-5, atol=1e-6)
    assert ref_ops["rsqrt"] == ref_ops["silu"] == 0  # no recompute without checkpointing
    assert ops["rsqrt"] > 0 and ops["silu"] > 0  # element-wise ops are recomputed
    if mode == "selective":  # matmuls and attention are kept, not recomputed
        assert ops["mm"] == ref_ops["mm"] and ops[SDPA_CPU] == 0
    else:  # true / offload recompute the whole layer
        assert ops["mm"] > ref_ops["mm"] and ops[SDPA_CPU] > 0
    if mode == "offload":  # the saved layer inputs went through the offload hooks and back
        assert offload.packed > 0 and offload.unpacked == offload.packed


def _lora_bf16_model():
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    model = get_peft_model(build_model("qwen2").to(torch.bfloat16),
                           LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "o_proj"]))
    for name, p in model.named_parameters():
        if "lora_" in name:
            p.data = p.data.float()  # adapters in fp32 over a bf16 base, as the trainer has them
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.1)
    return model


def _saved_storages(model, ids) -> tuple[float, dict, set]:
    storages = set()

    def pack(t):
        storages.add(t.untyped_storage().data_ptr())
        return t

    with torch.autocast("cpu", dtype=torch.bfloat16), \
            torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.item(), grads, storages


def test_lora_inputs_skip_the_fp32_round_trip_under_autocast():
    """Under autocast the adapters read the layer input as it is: the same loss and adapter
    gradients, and backward keeps no cast copy of each adapted input."""
    from tunesmith.models.acceleration import keep_lora_inputs_in_compute_dtype

    ids = torch.randint(3, 300, (2, 16), generator=torch.Generator().manual_seed(0))
    ref = _lora_bf16_model()
    loss_ref, grads_ref, kept_ref = _saved_storages(ref, ids)
    model = _lora_bf16_model()
    assert keep_lora_inputs_in_compute_dtype(model) == 2 * len(model.base_model.model.model.layers)
    loss, grads, kept = _saved_storages(model, ids)
    assert loss == loss_ref and grads.keys() == grads_ref.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, grads_ref[name], rtol=0, atol=0, msg=name)
    # backward keeps o_proj's input as attention saved it, not a cast copy: one storage fewer
    # per layer (q_proj's input, the norm's output, is kept either way: once)
    assert len(kept_ref) - len(kept) == len(model.base_model.model.model.layers)
