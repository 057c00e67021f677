"""GPU suite (run on the H200 with `pytest -m gpu tests/gpu`): every fast path against its
reference twin in bf16, and a real training run on the GPU."""

from __future__ import annotations

import pytest
import torch

from tunesmith.kernels.attention import varlen_attention_forward, varlen_attention_reference
from tunesmith.kernels.fused import FusedRMSNorm, liger_ops, rms_norm_reference
from tunesmith.kernels.linear_ce import (
    chunked_linear_cross_entropy,
    linear_cross_entropy_reference,
)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def test_varlen_flash_matches_reference_bf16(monkeypatch):
    from tunesmith.kernels import attention

    assert attention.varlen_kernel_available(), (
        f"torch {torch.__version__} has no torch.nn.attention.varlen: the flash path cannot "
        "run, and this test would compare the reference with itself")
    calls = []
    flash = attention._flash_varlen
    monkeypatch.setattr(attention, "_flash_varlen",
                        lambda *a, **kw: calls.append(1) or flash(*a, **kw))
    torch.manual_seed(0)
    lengths = [700, 1, 129, 2048, 333]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    n = sum(lengths)
    q = torch.randn(1, 28, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 4, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 4, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    out, _ = varlen_attention_forward(torch.nn.Module(), q, k, v, None, scaling=128 ** -0.5,
                                      cu_seq_lens_q=cu, max_length_q=max(lengths))
    flat = [t.detach().float().transpose(1, 2).reshape(n, t.shape[1], 128).requires_grad_()
            for t in (q, k, v)]
    ref = varlen_attention_reference(*flat, cu, 128 ** -0.5)
    assert calls == [1], "the flash varlen kernel did not run"
    assert _rel(out.reshape(n, 28, 128), ref) < 1e-2
    grad = torch.randn_like(ref)
    out.reshape(n, 28, 128).backward(grad.to(out.dtype))
    ref.backward(grad)
    for mine, theirs in zip((q, k, v), flat, strict=True):
        assert _rel(mine.grad.transpose(1, 2).reshape(theirs.shape), theirs.grad) < 2e-2


def test_varlen_flash_keeps_grouped_kv_unexpanded():
    """On this torch the flash kernel takes Qwen2.5-7B's 4 K/V heads for 28 Q heads as they
    are: backward keeps Q and the output at 28 heads, K and V at 4 (not expanded copies)."""
    from tunesmith.kernels import attention

    assert attention.native_gqa(), (
        f"torch {torch.__version__}: the varlen kernel did not take grouped K/V in the probe")
    n = 4096
    q = torch.randn(1, 28, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(1, 4, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(1, 4, n, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    saved = []

    def pack(t):
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        varlen_attention_forward(torch.nn.Module(), q, k, v, None, scaling=128 ** -0.5)
    full = [s for s in saved if torch.Size(s).numel() == n * 28 * 128]
    grouped = [s for s in saved if torch.Size(s).numel() == n * 4 * 128]
    assert len(full) == 2 and len(grouped) == 2, saved


def test_chunked_cross_entropy_bf16():
    torch.manual_seed(0)
    h = torch.randn(4096, 1024, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(32000, 1024, device="cuda", dtype=torch.bfloat16) * 0.02).requires_grad_()
    t = torch.randint(0, 32000, (4096,), device="cuda")
    out = chunked_linear_cross_entropy(h, w, t, 1024)
    out.backward()
    hf, wf = h.detach().float().requires_grad_(), w.detach().float().requires_grad_()
    ref = linear_cross_entropy_reference(hf, wf, t)
    ref.backward()
    assert abs(out.item() - ref.item()) / ref.item() < 1e-3
    assert _rel(h.grad, hf.grad) < 1e-2 and _rel(w.grad, wf.grad) < 1e-2


@pytest.mark.skipif(liger_ops() is None, reason="liger-kernel not installed")
def test_liger_rmsnorm_matches_reference(monkeypatch):
    x = torch.randn(8, 512, 3584, device="cuda", dtype=torch.bfloat16)
    weight = torch.nn.Parameter(torch.rand(3584, device="cuda", dtype=torch.bfloat16) + 0.5)
    from types import SimpleNamespace

    from tunesmith.kernels import fused as fused_module

    real, calls = liger_ops(), []
    counted = {**real, "rms_norm": SimpleNamespace(
        apply=lambda *a: calls.append(1) or real["rms_norm"].apply(*a))}
    monkeypatch.setattr(fused_module, "liger_ops", lambda: counted)
    fused = FusedRMSNorm(weight, 1e-6, use_liger=True)
    out = fused(x)
    assert calls == [1], "liger's kernel did not run"
    assert _rel(out, rms_norm_reference(x, weight, 1e-6)) < 1e-2


def test_tiny_training_run_on_gpu(tmp_path, tiny_llama_dir, alpaca_file):
    from tunesmith.config import load_config
    from tunesmith.recipes.sft import run_sft

    cfg = load_config(overrides={"model_name_or_path": str(tiny_llama_dir),
                                 "dataset": str(alpaca_file), "output_dir": str(tmp_path / "o"),
                                 "max_steps": 6, "bf16": True, "learning_rate": 5e-3,
                                 "per_device_train_batch_size": 4, "save_steps": 3,
                                 "gradient_checkpointing": "selective"})
    summary = run_sft(cfg)
    assert summary["steps"] == 6 and summary["skipped_nonfinite_steps"] == 0
    assert summary["performance"]["peak_memory_kind"] == "GPU allocated"
