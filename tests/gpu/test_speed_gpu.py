"""GPU suite for the speed levers (`pytest -m gpu tests/gpu`): the same CLI runs as
tests/test_speed_levers.py with the real kernels (bf16, inductor), and proof that the real
varlen FlashAttention kernel ran, never a silent fallback to the reference twin."""

from __future__ import annotations

import json

import pytest
import torch

from test_speed_levers import COMBOS, LAYERS, STEPS, run_train
from tunesmith.kernels.attention import VARLEN_ATTENTION

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


@pytest.fixture(autouse=True)
def _fresh_dynamo(tmp_path, monkeypatch):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("attention,packing,checkpointing,compile_mode", COMBOS)
def test_levers_on_gpu(tmp_path, tiny_llama_dir, alpaca_file, attention, packing,
                       checkpointing, compile_mode):
    compiled = compile_mode != "false" and checkpointing != "selective"  # selective: eager
    summary = run_train(tmp_path, tiny_llama_dir, alpaca_file, attn_implementation=attention,
                        packing=packing, gradient_checkpointing=checkpointing,
                        torch_compile=compile_mode != "false", bf16=True)
    sp = summary["speed"]
    assert summary["skipped_nonfinite_steps"] == 0
    assert sp["attention"] == (VARLEN_ATTENTION if attention == "varlen" else attention)
    assert sp.get("varlen_calls", {}).get("reference", 0) == 0  # never the twin on a GPU
    if attention == "varlen" and not compiled:
        assert sp["varlen_calls"]["flash"] >= LAYERS * STEPS
    assert sp["checkpointed_layers"] == (LAYERS if checkpointing != "false" else 0)
    assert (sp["offloaded_mb"] > 0) == (checkpointing == "offload")
    assert sp["compile_fallback"] == "" and (sp["compiled_graphs"] > 0) == compiled


def test_defaults_pick_varlen_and_compile_on_gpu(tmp_path, tiny_llama_dir, alpaca_file):
    """A YAML without speed keys: packed bf16 batches get varlen flash attention and the
    decoder layers compile (auto), with no fallback."""
    summary = run_train(tmp_path, tiny_llama_dir, alpaca_file, packing=True, bf16=True)
    sp = summary["speed"]
    assert sp["attention"] == VARLEN_ATTENTION and sp["attention_reason"].startswith("auto")
    assert sp["compile"] and sp["compiled_graphs"] > 0 and sp["compile_fallback"] == ""
    assert sp["compiled_loss"]  # the loss chunks too, without a fallback
    assert sp["lagged_steps"] is True  # fused AdamW on CUDA: no host sync per step
    assert sp["lora_inputs_uncast"] > 0  # bf16 autocast: no fp32 round trip of LoRA inputs
    assert summary["performance"]["steady_mfu"] is None or summary["performance"]["steady_mfu"] > 0
    # the device's peak is known on a data-centre GPU, so every step record with a rate
    # carries live MFU (the first step has no rate yet: it holds the compile warm-up)
    steps = [json.loads(line) for line in (tmp_path / "out" / "metrics.jsonl").open()
             if '"loss"' in line and '"eval' not in line]
    timed = [r for r in steps if r["tokens_per_s"] > 0]
    assert timed and all(0 < r["mfu"] < 1 for r in timed), steps


def test_varlen_flash_kernel_runs_inside_compiled_recompute(tmp_path, tiny_llama_dir,
                                                           alpaca_file):
    """Compiled, checkpointed layers with varlen attention: one graph per layer variant
    (no graph break that would leave the layer eager) and the flash kernel in the trace."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        summary = run_train(tmp_path, tiny_llama_dir, alpaca_file, packing=True, bf16=True,
                            attn_implementation="varlen", gradient_checkpointing="true",
                            torch_compile=True)
    sp = summary["speed"]
    assert sp["attention"] == VARLEN_ATTENTION and sp["checkpointed_layers"] == LAYERS
    assert sp["compiled_graphs"] > 0 and sp["compile_fallback"] == ""
    kernels = " ".join(e.key.lower() for e in prof.key_averages())
    assert "flash" in kernels, "no FlashAttention kernel ran"


def test_tf32_and_upcast_on_gpu(tmp_path, tiny_llama_dir, alpaca_file):
    before = torch.backends.cuda.matmul.allow_tf32
    try:
        summary = run_train(tmp_path, tiny_llama_dir, alpaca_file, bf16=True, tf32=True,
                            upcast_layernorm=True, torch_compile=False)
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        assert summary["speed"]["upcast_params"] == 2 * LAYERS + 1  # bf16 base, LoRA
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def test_compile_cache_second_run_loads_artifacts(tmp_path, tiny_llama_dir, alpaca_file,
                                                  monkeypatch):
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    keys = dict(packing=True, bf16=True, torch_compile=True)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first = run_train(tmp_path / "a", tiny_llama_dir, alpaca_file, **keys)["speed"]
    torch._dynamo.reset()
    second = run_train(tmp_path / "b", tiny_llama_dir, alpaca_file, **keys)["speed"]
    assert first["compile_cache"]["artifacts_saved"]
    assert second["compile_cache"]["artifacts_loaded"]
    print(f"time to first step: first {first['time_to_first_step_s']:.1f} s, second "
          f"{second['time_to_first_step_s']:.1f} s")


def test_unpacked_defaults_run_padding_free_on_gpu(tmp_path, tiny_llama_dir, alpaca_file):
    """A YAML without packing or speed keys (LLaMA-Factory's default data path): each
    micro-batch of 4 runs as one row through varlen flash attention, compiled, and trains
    the losses of padded rows."""
    keys = {"per_device_train_batch_size": 4, "bf16": True, "max_steps": 4}
    flat = run_train(tmp_path / "flat", tiny_llama_dir, alpaca_file, **keys)
    padded = run_train(tmp_path / "padded", tiny_llama_dir, alpaca_file,  # eager: quicker
                       padding_free="false", torch_compile=False, **keys)
    sp = flat["speed"]
    assert sp["padding_free"] is True and sp["padding_free_reason"].startswith("auto")
    assert sp["padding_free_batches"] == 4 and sp["attention"] == VARLEN_ATTENTION
    assert sp["compile"] and sp["compile_fallback"] == ""
    assert padded["speed"]["padding_free"] is False and padded["speed"]["attention"] == "sdpa"

    def losses(run):
        return [json.loads(line)["loss"] for line in (tmp_path / run / "out" /
                "metrics.jsonl").open() if '"loss"' in line and '"eval' not in line]

    ref, got = losses("padded"), losses("flat")
    assert len(ref) == len(got) == 4
    assert all(abs(a - b) < 2e-2 * abs(b) for a, b in zip(got, ref, strict=True)), (got, ref)


def test_whole_rows_under_varlen_take_sdpa_and_match_the_reference():
    """Rows without packing under tunesmith_varlen (a padding-free run's batch without
    padding) go to SDPA's causal kernel; the output equals the per-segment reference."""
    from tunesmith.kernels.attention import (
        VARLEN_CALLS,
        row_cu_seqlens,
        varlen_attention_forward,
        varlen_attention_reference,
    )

    torch.manual_seed(0)
    b, h, hkv, t, d = 2, 8, 2, 256, 64
    q = torch.randn(b, h, t, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(b, hkv, t, d, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(b, hkv, t, d, device="cuda", dtype=torch.bfloat16)
    before = VARLEN_CALLS["sdpa_rows"]
    out, _ = varlen_attention_forward(None, q, k, v, None, scaling=d ** -0.5)
    assert VARLEN_CALLS["sdpa_rows"] == before + 1 and out.shape == (b, t, h, d)
    flat = lambda x: x.transpose(1, 2).reshape(b * t, x.shape[1], d).float()  # noqa: E731
    ref = varlen_attention_reference(flat(q), flat(k), flat(v),
                                     row_cu_seqlens(b, t, q.device), d ** -0.5)
    torch.testing.assert_close(out.float().reshape(b * t, h, d), ref, rtol=2e-2, atol=2e-2)
