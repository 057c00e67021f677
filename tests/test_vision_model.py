"""Vision-language model path on the tiny Qwen2-VL: our loss (own mrope positions, loss
from hidden states) equals the model's own forward; packed equals unpacked (loss and
gradients); the frozen parts and LoRA targets follow the freeze_* keys."""

from __future__ import annotations

import pytest
import torch

from test_vision_data import _prepare
from tiny_vl import build_vl_tokenizer, write_mm_dataset
from tunesmith.adapters.setup import prepare_trainable
from tunesmith.adapters.vision import VisionParts
from tunesmith.config.schema import FinetuningConfig
from tunesmith.data.batching import collate
from tunesmith.data.packing import PackedRow
from tunesmith.models.loader import load_causal_lm
from tunesmith.train.objective import NextTokenObjective


@pytest.fixture(scope="module")
def mm_samples(tiny_vl_dir, tmp_path_factory):
    folder = write_mm_dataset(tmp_path_factory.mktemp("mm") / "data")
    data, vision = _prepare(build_vl_tokenizer(), tiny_vl_dir, dataset=["mm"],
                            dataset_dir=str(folder))
    samples = [data.train[i] for i in range(len(data.train))]
    return sorted(samples, key=lambda s: [m.kind for m in s.media or []]), vision


@pytest.fixture(scope="module")
def qwen3_vl(tmp_path_factory):
    """Tiny Qwen3-VL and its image samples (its videos are refused: timestamps)."""
    from tiny_vl import save_tiny_qwen3_vl

    model_dir = save_tiny_qwen3_vl(tmp_path_factory.mktemp("tiny-qwen3-vl"))
    folder = write_mm_dataset(tmp_path_factory.mktemp("mm3") / "data")
    data, vision = _prepare(build_vl_tokenizer(), model_dir, dataset=["mm"],
                            dataset_dir=str(folder), on_bad_row="skip")
    assert [b.reason[:20] for b in data.report.bad_rows] == ["videos for Qwen3-VL "]
    return model_dir, [data.train[i] for i in range(len(data.train))], vision


@pytest.fixture(scope="module")
def qwen2_5_vl(tmp_path_factory):
    from tiny_vl import save_tiny_qwen2_5_vl

    model_dir = save_tiny_qwen2_5_vl(tmp_path_factory.mktemp("tiny-qwen2.5-vl"))
    folder = write_mm_dataset(tmp_path_factory.mktemp("mm25") / "data")
    data, vision = _prepare(build_vl_tokenizer(), model_dir, dataset=["mm"],
                            dataset_dir=str(folder))
    return model_dir, [data.train[i] for i in range(len(data.train))], vision


@pytest.fixture(params=["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def arch(request, tiny_vl_dir, mm_samples):
    if request.param == "qwen2_vl":
        return tiny_vl_dir, *mm_samples
    return request.getfixturevalue(request.param)


def _seconds_per_grid(batch, vision) -> dict:
    """Qwen2.5-VL's video time input: temporal_patch_size / video_fps seconds per grid."""
    if vision.architecture != "qwen2_5_vl" or batch.video_grid_thw is None:
        return {}
    n = len(batch.video_grid_thw)
    return {"second_per_grid_ts": torch.full((n,), vision.temporal_patch_size
                                             / vision.video_fps)}


def test_loss_equals_the_models_own_forward(arch):
    model_dir, samples, vision = arch
    model = load_causal_lm(str(model_dir)).eval()
    batch = collate(samples, pad_id=0)
    ours = NextTokenObjective("reference").loss_sum(model, batch) / batch.n_targets
    labels = torch.full_like(batch.input_ids, -100).view(-1)
    labels[batch.target_index + 1] = batch.target_ids  # the label of t+1 at t+1
    image_id, video_id = vision.media_token_ids
    types = (batch.input_ids == image_id).int() + 2 * (batch.input_ids == video_id).int()
    ref = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                pixel_values=batch.pixel_values, image_grid_thw=batch.image_grid_thw,
                pixel_values_videos=batch.pixel_values_videos,
                video_grid_thw=batch.video_grid_thw, mm_token_type_ids=types,
                labels=labels.view_as(batch.input_ids), **_seconds_per_grid(batch, vision)).loss
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def _loss_and_grads(model, batch):
    model.zero_grad()
    loss = NextTokenObjective("reference").loss_sum(model, batch)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                           if p.grad is not None}


def test_packed_equals_unpacked_loss_and_gradients(tiny_vl_dir, mm_samples):
    samples, _ = mm_samples
    model = load_causal_lm(str(tiny_vl_dir))
    model.model.visual.requires_grad_(True)
    loss_a, grads_a = _loss_and_grads(model, collate(samples, pad_id=0))
    packed = collate([PackedRow(samples[:2]), PackedRow(samples[2:])], pad_id=0)
    assert packed.mrope_position_ids[:, 0, len(samples[0])] .tolist() == [0, 0, 0]
    loss_b, grads_b = _loss_and_grads(model, packed)
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-4)
    assert grads_a.keys() == grads_b.keys() and any("visual" in n for n in grads_a)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grad, grads_b[name], rtol=1e-4, atol=1e-5, msg=name)


def test_packed_varlen_equals_unpacked(tiny_vl_dir, mm_samples):
    """Packed rows under varlen attention (vision tower run apart, language model with the
    rows' segments) give the unpacked loss and gradients; the tower stays bidirectional."""
    from tunesmith.models.acceleration import use_varlen_attention

    samples, _ = mm_samples
    model = load_causal_lm(str(tiny_vl_dir))
    model.model.visual.requires_grad_(True)
    loss_a, grads_a = _loss_and_grads(model, collate(samples, pad_id=0))
    use_varlen_attention(model)
    assert model.model.visual.config._attn_implementation == "sdpa"
    packed = collate([PackedRow(samples[:2]), PackedRow(samples[2:])], pad_id=0)
    loss_b, grads_b = _loss_and_grads(model, packed)
    torch.testing.assert_close(loss_a, loss_b, rtol=1e-5, atol=1e-4)
    for name, grad in grads_a.items():
        torch.testing.assert_close(grad, grads_b[name], rtol=1e-4, atol=1e-5, msg=name)


def _trainable(model) -> set[str]:
    parts = VisionParts(True, True, True)
    return {parts.part_of(n) for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize(("flags", "kind", "expected"), [
    ((True, True, False), "lora", {"language"}),
    ((False, True, False), "lora", {"language", "tower"}),
    ((True, False, True), "full", {"projector"}),
    ((True, True, False), "full", {"language"}),
])
def test_frozen_parts_follow_the_keys(tiny_vl_dir, flags, kind, expected):
    model = load_causal_lm(str(tiny_vl_dir))
    model = prepare_trainable(model, FinetuningConfig(finetuning_type=kind), [],
                              vision=VisionParts(*flags))
    assert _trainable(model) == expected


def test_mrope_positions_equal_get_rope_index(arch):
    """Exact integer positions (the loss test alone is blind to small shifts on a random
    tiny model)."""
    import inspect

    model_dir, samples, vision = arch
    model = load_causal_lm(str(model_dir))
    batch = collate(samples, pad_id=0)
    image_id, video_id = vision.media_token_ids
    kw = {"image_grid_thw": batch.image_grid_thw, "video_grid_thw": batch.video_grid_thw,
          "attention_mask": batch.attention_mask}
    if "mm_token_type_ids" in inspect.signature(model.model.get_rope_index).parameters:
        kw["mm_token_type_ids"] = ((batch.input_ids == image_id).int()
                                   + 2 * (batch.input_ids == video_id).int())
    ref, _ = model.model.get_rope_index(batch.input_ids, **kw,
                                        **_seconds_per_grid(batch, vision))
    real = batch.attention_mask.bool()
    assert torch.equal(batch.mrope_position_ids[:, real], ref[:, real])


def test_multimodal_keys_through_the_cli(tmp_path, tiny_vl_dir, monkeypatch):
    """Packing, unfrozen tower and projector (LoRA reaches them), media_dir and the video
    keys: each reaches the run from the YAML."""
    import json

    import yaml

    from tunesmith.cli.main import main

    folder = write_mm_dataset(tmp_path / "media")
    monkeypatch.chdir(tmp_path)
    keys = {"video_maxlen": 2, "video_fps": 1.0, "video_min_pixels": 28 * 28,
            "video_max_pixels": 56 * 56, "image_min_pixels": 64 * 64,
            "image_max_pixels": 80 * 80}
    cfg = {"model_name_or_path": str(tiny_vl_dir), "dataset": str(folder / "mm.json"),
           "media_dir": str(folder), "template": "qwen", "output_dir": "out", "max_steps": 1,
           "neat_packing": True, "cutoff_len": 512, "save_steps": 0,
           "attn_implementation": "varlen",
           "freeze_vision_tower": False, "freeze_multi_modal_projector": False, **keys}
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "t.yaml"]) == 0
    data = json.loads((tmp_path / "out" / "run_summary.json").read_text())["data"]
    assert data["packed_rows"] < data["samples"] == 4
    from safetensors import safe_open

    with safe_open(tmp_path / "out" / "adapter_model.safetensors", "pt") as f:
        names = list(f.keys())
    assert any("visual.blocks" in n for n in names)
    assert any("visual.merger" in n for n in names)
    assert any("language_model" in n for n in names)
    tok = build_vl_tokenizer()
    expected, _ = _prepare(tok, tiny_vl_dir, dataset=[str(folder / "mm.json")],
                           dataset_dir=str(folder), **{})
    assert data["total_tokens"] != expected.report.summary()["total_tokens"]  # keys changed it


def test_fused_module_swap_reaches_the_language_model(tiny_vl_dir, mm_samples):
    from tunesmith.models.acceleration import apply_fused_kernels

    samples, _ = mm_samples
    model = load_causal_lm(str(tiny_vl_dir)).eval()
    batch = collate(samples, pad_id=0)
    before = NextTokenObjective("reference").loss_sum(model, batch)
    assert apply_fused_kernels(model, use_liger=False) == 2 * 2 + 1 + 2  # norms, final, MLPs
    after = NextTokenObjective("reference").loss_sum(model, batch)
    torch.testing.assert_close(before, after, rtol=1e-5, atol=1e-5)
