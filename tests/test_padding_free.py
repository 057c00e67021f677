"""padding_free: an unpacked micro-batch runs as one row of its samples back to back. The
batch holds the same samples and targets, the loss and gradients equal the padded batch's,
and `tunesmith train` trains the same steps (and says so in its summary)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import yaml

from test_speed_levers import run_train
from tiny import build_model
from tunesmith.cli.main import main
from tunesmith.config import load_config
from tunesmith.data.batching import collate
from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.errors import ConfigError
from tunesmith.kernels.attention import VARLEN_ATTENTION, register_varlen_attention
from tunesmith.models.acceleration import set_attention
from tunesmith.models.speed import resolve_padding_free
from tunesmith.train.objective import NextTokenObjective


def _samples(lengths=(7, 3, 11)) -> list[EncodedSample]:
    rng = np.random.default_rng(0)
    out = []
    for n in lengths:
        ids = rng.integers(3, 300, n).astype(np.int64)
        labels = ids.copy()
        labels[: n // 3] = IGNORE_INDEX  # a prompt part
        out.append(EncodedSample(ids, labels))
    return out


def test_flattened_batch_holds_the_same_samples_and_targets():
    samples = _samples()
    padded, flat = collate(samples, 0), collate(samples, 0, flatten=True)
    assert padded.input_ids.shape == (3, 11) and flat.input_ids.shape == (1, 21)
    assert flat.n_tokens == padded.n_tokens == 21 and flat.n_targets == padded.n_targets
    assert flat.cu_seqlens.tolist() == [0, 7, 10, 21] and flat.max_seqlen == 11
    assert flat.position_ids[0].tolist() == [*range(7), *range(3), *range(11)]
    assert flat.lengths() == padded.lengths() == [7, 3, 11]
    # each target is the same (context token, next token) pair in both layouts
    def pairs(b):
        flat_ids = b.input_ids.reshape(-1)
        return sorted(zip(flat_ids[b.target_index].tolist(), b.target_ids.tolist(),
                          strict=True))
    assert pairs(flat) == pairs(padded)
    torch.testing.assert_close(torch.sort(flat.target_ids).values,
                               torch.sort(padded.target_ids).values)


@pytest.mark.parametrize("attention", ["sdpa", "eager", "varlen"])
def test_flattened_loss_and_gradients_equal_the_padded_batch(attention):
    samples = _samples()

    def grads(flatten: bool):
        torch.manual_seed(0)
        model = build_model("llama")
        if attention == "varlen":
            register_varlen_attention()
        set_attention(model, VARLEN_ATTENTION if attention == "varlen" else attention)
        loss = NextTokenObjective().loss_sum(model, collate(samples, 0, flatten=flatten))
        loss.backward()
        return loss.detach(), {n: p.grad for n, p in model.named_parameters()}

    ref_loss, ref = grads(False)
    loss, got = grads(True)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=1e-4, atol=1e-6, msg=name)


def _cfg(**keys):
    return load_config(overrides={"model_name_or_path": "m", **keys})


@pytest.mark.parametrize("keys,device,expected,why", [
    ({"bf16": True}, "cuda", True, "auto: unpacked batches"),
    ({}, "cuda", False, "needs torch's varlen FlashAttention"),  # fp32
    ({"bf16": True}, "cpu", False, "needs torch's varlen FlashAttention"),
    ({"bf16": True, "attn_implementation": "sdpa"}, "cuda", False, "runs padded rows"),
    ({"bf16": True, "packing": True}, "cuda", False, "packed"),
    ({"bf16": True, "stage": "kto"}, "cuda", False, "stage kto"),
    ({"bf16": True, "padding_free": "false"}, "cuda", False, "padding_free: false"),
    ({"padding_free": "true"}, "cpu", True, "padding_free: true"),
])
def test_padding_free_resolution(keys, device, expected, why):
    flat, reason = resolve_padding_free(_cfg(**keys), torch.device(device))
    assert flat is expected and why in reason, reason


def test_padding_free_true_refuses_what_it_cannot_flatten():
    with pytest.raises(ConfigError, match="padding_free: true cannot be applied: stage dpo"):
        resolve_padding_free(_cfg(padding_free="true", stage="dpo"), torch.device("cpu"))
    with pytest.raises(ConfigError, match="vision-language"):
        resolve_padding_free(_cfg(padding_free="true"), torch.device("cpu"), vision=True)


def _losses(out_dir) -> list[float]:
    rows = [json.loads(line) for line in (out_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and "step" in r and "eval_loss" not in r]


@pytest.mark.parametrize("attention", ["sdpa", "varlen"])
def test_train_padding_free_matches_padded_rows(tmp_path, tiny_llama_dir, alpaca_file,
                                                attention):
    """The real CLI, unpacked batches of 4: padding_free true trains the same losses as
    padded rows, reports it, and the varlen path ran on the flattened rows."""
    keys = {"per_device_train_batch_size": 4, "attn_implementation": attention,
            "max_steps": 3}
    padded = run_train(tmp_path / "padded", tiny_llama_dir, alpaca_file,
                       padding_free="false", **keys)
    flat = run_train(tmp_path / "flat", tiny_llama_dir, alpaca_file, padding_free="true",
                     **keys)
    assert padded["speed"]["padding_free"] is False
    assert flat["speed"]["padding_free"] is True
    assert flat["speed"]["padding_free_reason"] == "padding_free: true"
    # every micro-batch of the run was trained as one row (batch size 4: one per step)
    assert flat["speed"]["padding_free_batches"] == 3
    assert padded["speed"]["padding_free_batches"] == 0
    if attention == "varlen":
        assert flat["speed"]["varlen_calls"]["reference"] >= 2 * 3
    ref, got = _losses(tmp_path / "padded" / "out"), _losses(tmp_path / "flat" / "out")
    assert len(ref) == len(got) == 3
    np.testing.assert_allclose(got, ref, rtol=1e-4)
    assert flat["performance"]["tokens"] == padded["performance"]["tokens"]


def test_train_padding_free_true_with_a_preference_stage_fails_before_loading(
        tmp_path, tiny_llama_dir, alpaca_file, capsys):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_llama_dir),
                                    "dataset": str(alpaca_file), "stage": "dpo",
                                    "padding_free": "true", "output_dir": str(tmp_path / "o")}))
    assert main(["train", str(path)]) != 0
    assert "padding_free: true cannot be applied: stage dpo" in capsys.readouterr().err


def test_a_batch_without_padding_keeps_its_rows():
    """Samples of one length have no padding: the batch stays [B, T] (whole rows take
    SDPA's fused kernels on a GPU, faster than varlen there)."""
    samples = _samples((5, 5, 5))
    flat = collate(samples, 0, flatten=True)
    assert flat.input_ids.shape == (3, 5) and flat.cu_seqlens is None
