"""A tiny Qwen2-VL (2 layers, hidden 64, a 2-block vision tower) with a tokenizer carrying
the vision tokens and an image processor config, built offline; and small media files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from tiny import build_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]


def build_vl_tokenizer():
    tok = build_tokenizer()
    tok.add_tokens(VISION_TOKENS, special_tokens=True)
    return tok


def save_tiny_qwen2_vl(folder: Path, seed: int = 0) -> Path:
    from transformers import AutoModelForImageTextToText, Qwen2VLConfig
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

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
    # small bounds keep the tiny tests' images at a few dozen tokens
    Qwen2VLImageProcessorPil(size={"shortest_edge": 56 * 56, "longest_edge": 28 * 28 * 16}
                             ).save_pretrained(folder)
    return folder


def write_image(path: Path, size: tuple[int, int] = (60, 40), seed: int = 0) -> Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path
