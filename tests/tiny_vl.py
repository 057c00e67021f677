"""A tiny Qwen2-VL (2 layers, hidden 64, a 2-block vision tower) with a tokenizer carrying
the vision tokens and an image processor config, built offline; and small media files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tiny import build_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
CLIP_MEAN = [0.48145466, 0.4578275, 0.40821073]
CLIP_STD = [0.26862954, 0.26130258, 0.27577711]


def write_processor_config(folder: Path, patch: int, mean: list[float], std: list[float]) -> None:
    """The image processor's config as transformers writes it (written directly, so it does
    not depend on which processor classes this transformers has); small pixel bounds keep the
    tiny tests' images at a few dozen tokens."""
    import json

    side = patch * 2
    (folder / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Qwen2VLImageProcessor", "patch_size": patch, "merge_size": 2,
        "temporal_patch_size": 2, "image_mean": mean, "image_std": std, "do_resize": True,
        "do_rescale": True, "do_normalize": True, "do_convert_rgb": True, "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": side * side * 4, "longest_edge": side * side * 16}}))


def build_vl_tokenizer():
    tok = build_tokenizer()
    tok.add_tokens(VISION_TOKENS, special_tokens=True)
    return tok


def save_tiny_qwen2_vl(folder: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForImageTextToText, Qwen2VLConfig

    tok = build_vl_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]},
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id)
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2)
    cfg = Qwen2VLConfig(text_config=text, vision_config=vision,
                        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False,
                        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                        pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32,
                                                    attn_implementation="sdpa")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    write_processor_config(folder, patch=14, mean=CLIP_MEAN, std=CLIP_STD)
    return folder


def write_image(path: Path, size: tuple[int, int] = (60, 40), seed: int = 0) -> Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


def write_video(path: Path, frames: int = 6, size: tuple[int, int] = (64, 48), fps: int = 2
                ) -> Path:
    """A short MPEG-4 clip written with PyAV."""
    import av

    rng = np.random.default_rng(7)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = size[0], size[1], "yuv420p"
        for _ in range(frames):
            img = rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                out.mux(packet)
        for packet in stream.encode():
            out.mux(packet)
    return path


MM_TAGS = {"role_tag": "role", "content_tag": "content", "user_tag": "user",
           "assistant_tag": "assistant"}


def mm_rows(video: str | list[str]) -> list[dict]:
    """Rows in LLaMA-Factory's mllm_demo layout: two images, a video, and text only."""
    def turn(q: str, a: str) -> list[dict]:
        return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]

    return [{"messages": turn("<image>Who is this?", "A player."), "images": ["pics/a.png"]},
            {"messages": turn("Compare <image> with <image>.", "They match."),
             "images": ["pics/a.png", "pics/b.jpg"]},
            {"messages": turn("<video>What happens?", "Nothing much."), "videos": [video]},
            {"messages": turn("hello", "hi there")}]


def write_mm_dataset(folder: Path, video: str | list[str] | None = None) -> Path:
    """dataset_dir with dataset_info.json entry `mm`, its rows and media files."""
    import json

    write_image(folder / "pics" / "a.png", (60, 40), 0)
    write_image(folder / "pics" / "b.jpg", (100, 80), 1)
    frames = [str(write_image(folder / "pics" / f"f{k}.png", (56, 56), 10 + k).relative_to(folder))
              for k in range(4)]
    (folder / "mm.json").write_text(json.dumps(mm_rows(video or frames)), encoding="utf-8")
    entry = {"file_name": "mm.json", "formatting": "sharegpt", "tags": MM_TAGS,
             "columns": {"messages": "messages", "images": "images", "videos": "videos"}}
    (folder / "dataset_info.json").write_text(json.dumps({"mm": entry}), encoding="utf-8")
    return folder


def save_tiny_qwen3_vl(folder: Path, seed: int = 0) -> Path:
    """Tiny Qwen3-VL (patch 16, deepstack, interleaved mrope), same tokenizer."""
    from transformers import AutoModelForImageTextToText, Qwen3VLConfig

    tok = build_vl_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                max_position_embeddings=1024, **special,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [2, 3, 3], "mrope_interleaved": True})
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                  num_position_embeddings=64, deepstack_visual_indexes=[0])
    cfg = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                        vision_start_token_id=ids["<|vision_start|>"],
                        vision_end_token_id=ids["<|vision_end|>"])
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32,
                                                    attn_implementation="sdpa")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    write_processor_config(folder, patch=16, mean=[0.5] * 3, std=[0.5] * 3)
    return folder


def save_tiny_qwen2_5_vl(folder: Path, seed: int = 0) -> Path:
    """Tiny Qwen2.5-VL (window attention, temporal positions scaled by tokens_per_second)."""
    from transformers import AutoModelForImageTextToText, Qwen2_5_VLConfig

    tok = build_vl_tokenizer()
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    special = dict(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                   pad_token_id=tok.pad_token_id)
    text = dict(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                rope_scaling={"type": "mrope", "mrope_section": [2, 3, 3]}, **special)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
                  patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                  fullatt_block_indexes=[1], tokens_per_second=4)
    cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=False,
                           image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                           vision_start_token_id=ids["<|vision_start|>"],
                           vision_end_token_id=ids["<|vision_end|>"], **special)
    torch.manual_seed(seed)
    model = AutoModelForImageTextToText.from_config(cfg, dtype=torch.float32,
                                                    attn_implementation="sdpa")
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    write_processor_config(folder, patch=14, mean=CLIP_MEAN, std=CLIP_STD)
    return folder
