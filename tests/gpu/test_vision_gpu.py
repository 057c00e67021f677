"""GPU suite, vision-language path: the tiny Qwen2-VL in bf16 on the GPU, packed rows under
varlen FlashAttention against the unpacked sdpa batch, and a CLI run with images."""

from __future__ import annotations

import json

import pytest
import torch
import yaml

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_packed_varlen_bf16_matches_unpacked(tiny_vl_dir, tmp_path):
    from test_vision_data import _prepare
    from tiny_vl import build_vl_tokenizer, write_mm_dataset
    from tunesmith.data.batching import collate
    from tunesmith.data.packing import PackedRow
    from tunesmith.models.acceleration import use_varlen_attention
    from tunesmith.models.loader import load_causal_lm
    from tunesmith.train.objective import NextTokenObjective

    folder = write_mm_dataset(tmp_path / "data")
    data, _ = _prepare(build_vl_tokenizer(), tiny_vl_dir, dataset=["mm"],
                       dataset_dir=str(folder))
    samples = [data.train[i] for i in range(len(data.train))]
    model = load_causal_lm(str(tiny_vl_dir), dtype=torch.bfloat16, device="cuda")
    cuda = torch.device("cuda")
    with torch.no_grad():
        ref = NextTokenObjective().loss_sum(model, collate(samples, 0).to(cuda))
        use_varlen_attention(model)
        packed = collate([PackedRow(samples[:2]), PackedRow(samples[2:])], 0).to(cuda)
        out = NextTokenObjective().loss_sum(model, packed)
    assert abs(float(out) - float(ref)) / float(ref) < 2e-2


def test_cli_trains_the_tiny_vlm_on_the_gpu(tiny_vl_dir, tmp_path, monkeypatch):
    from tiny_vl import write_mm_dataset
    from tunesmith.cli.main import main

    write_mm_dataset(tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    cfg = {"model_name_or_path": str(tiny_vl_dir), "dataset": "mm", "template": "qwen",
           "output_dir": "out", "max_steps": 3, "bf16": True, "neat_packing": True,
           "attn_implementation": "varlen", "cutoff_len": 512, "save_steps": 0}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "t.yaml"]) == 0
    summary = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert "H200" in summary["device"] or "NVIDIA" in summary["device"], summary["device"]
    assert summary["steps"] == 3
