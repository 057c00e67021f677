"""GPU suite: one 32,768-token row through `tunesmith train` (bf16, offloaded checkpointing)
with the real kernels: SDPA's causal flash path for the plain row, torch's varlen
FlashAttention for the packed one. No op of the run returns an L x L tensor (layers run
eagerly here: a dispatch mode does not see inside compiled graphs)."""

from __future__ import annotations

import pytest
import torch

from test_long_rows import run_long_row
from tiny import save_tiny_model

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

L = 32768


@pytest.mark.parametrize("attention,packing", [("auto", False), ("auto", True),
                                               ("sdpa", True)])
def test_long_row_on_gpu_has_no_l_by_l_tensor(tmp_path, attention, packing):
    model_dir = save_tiny_model(tmp_path / "model", "qwen2", max_positions=L)
    summary, seen = run_long_row(tmp_path, model_dir, L, attn_implementation=attention,
                                 packing=packing, bf16=True, torch_compile=False)
    assert seen.numel < L * L // 4, seen.where
    # a tiny model: well under 0.75 GB, while a [1, 1, L, L] bool mask alone is 1.07 GB
    assert summary["performance"]["peak_memory_gb"] < 0.75
    calls = summary["speed"]["varlen_calls"]
    assert calls.get("reference", 0) == 0  # never the twin on a GPU
    if packing and attention == "auto":
        assert summary["speed"]["attention"] == "tunesmith_varlen" and calls["flash"] >= 2
