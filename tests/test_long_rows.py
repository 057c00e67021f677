"""One long row (4,096 tokens) through `tunesmith train` with offloaded checkpointing: no
tensor of the run grows as L x L. A dispatch mode sees the output of every aten op the run
executes (forward, recompute, backward, loss), so an [L, L] attention mask or a [H, L, L]
score matrix anywhere would show up as the largest tensor."""

from __future__ import annotations

import json

import pytest
import torch
import yaml
from torch.utils._python_dispatch import TorchDispatchMode

from tiny import save_tiny_model
from tunesmith.cli.main import main

L = 4096


class LargestTensor(TorchDispatchMode):
    """Remembers the largest tensor any aten op returned, and that op."""

    def __init__(self):
        super().__init__()
        self.numel, self.where = 0, ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.numel:
                self.numel, self.where = t.numel(), f"{func} -> {tuple(t.shape)}"
        return out


@pytest.fixture(scope="module")
def long_model_dir(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny-long"), "qwen2", max_positions=L)


def run_long_row(tmp_path, model_dir, length: int, **keys) -> tuple[dict, LargestTensor]:
    """`tunesmith train` on one row cut to `length` tokens, offloaded checkpointing, LoRA;
    returns the run summary and what the dispatch mode saw."""
    words = "the quick brown fox jumps over the lazy dog".split()
    answer = " ".join(words[i % len(words)] for i in range(length + 200))
    data = tmp_path / "long.json"
    data.write_text(json.dumps([{"instruction": "Repeat.", "input": "", "output": answer}]))
    cfg = {"model_name_or_path": str(model_dir), "dataset": str(data), "template": "qwen",
           "cutoff_len": length, "gradient_checkpointing": "offload",
           "finetuning_type": "lora", "lora_target": "all", "max_steps": 1,
           "per_device_train_batch_size": 1, "output_dir": str(tmp_path / "out"),
           "save_steps": 0, "plot_loss": False, "logging_steps": 1, **keys}
    path = tmp_path / "train.yaml"
    path.write_text(yaml.safe_dump(cfg))
    with LargestTensor() as seen:
        assert main(["train", str(path)]) == 0
    summary = json.loads((tmp_path / "out" / "run_summary.json").read_text())
    assert summary["data"]["total_tokens"] == length  # the one row, cut to cutoff_len
    assert summary["speed"]["offloaded_mb"] > 0
    return summary, seen


@pytest.mark.parametrize("attention,packing", [
    ("sdpa", True),     # packed row of one sample: was a [1, 1, L, L] block-diagonal mask
    ("varlen", True),   # the varlen reference twin: was [H, L, L] scores (3-D SDPA, math)
    ("sdpa", False),    # the plain row: SDPA's causal path
])
def test_long_row_has_no_l_by_l_tensor(tmp_path, long_model_dir, attention, packing):
    _, seen = run_long_row(tmp_path, long_model_dir, L, attn_implementation=attention,
                           packing=packing)
    # the largest legitimate tensors are [L, vocab] / [L, intermediate] (vocab ~400 here)
    assert seen.numel < L * L // 4, seen.where


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_one_sample_per_row_skips_the_mask_and_equals_unpacked(attention):
    """Packed rows that each hold one whole sample (no padding) take plain causal attention:
    no mask is passed, and loss and gradients equal the unpacked batch's. A row of two
    samples still gets its block-diagonal mask."""
    import numpy as np

    from tiny import build_model
    from tunesmith.data.batching import collate, collate_packed
    from tunesmith.data.encode import EncodedSample
    from tunesmith.data.packing import PackedRow
    from tunesmith.train.objective import NextTokenObjective, trunk_inputs

    rng = np.random.default_rng(0)
    a, b = (EncodedSample(*(rng.integers(3, 300, size=(2, 11), dtype=np.int32))),
            EncodedSample(*(rng.integers(3, 300, size=(2, 11), dtype=np.int32))))
    model = build_model("qwen2", seed=1)
    model.set_attn_implementation(attention)
    one_each = collate_packed([PackedRow([a]), PackedRow([b])], pad_id=0)
    assert "attention_mask" not in trunk_inputs(one_each, model.model)
    shared = collate_packed([PackedRow([a, b])], pad_id=0)
    assert trunk_inputs(shared, model.model)["attention_mask"].shape == (1, 1, 22, 22)

    def loss_and_grads(batch):
        model.zero_grad()
        loss = NextTokenObjective("reference").loss_sum(model, batch)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()]

    loss_p, grads_p = loss_and_grads(one_each)
    loss_u, grads_u = loss_and_grads(collate([a, b], pad_id=0))
    assert torch.allclose(loss_p, loss_u, atol=1e-5)
    for gp, gu in zip(grads_p, grads_u, strict=True):
        assert torch.allclose(gp, gu, atol=1e-5, rtol=1e-4)
