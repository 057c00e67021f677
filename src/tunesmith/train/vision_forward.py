"""Padding-free (varlen) packed rows on a Qwen2-VL / Qwen2.5-VL trunk.

The model's own forward hands every keyword to the vision tower as well as to the language
model, so the text rows' `cu_seq_lens_*` would collide with the tower's own segment keys.
Here the tower runs on the pixels alone, its features replace the placeholder embeddings
(as the model does), and only the language model sees the varlen keys:

    pixels --get_image/video_features--> [N_img, H] --masked_scatter at <|image_pad|>-->
    embeds [B, T, H] --language_model(cu_seq_lens, 4-row positions)--> hidden [B, T, H]

Qwen3-VL also feeds tower features into early decoder layers (deepstack), which this path
does not do, so varlen is refused for it (models/processor.py).
"""

from __future__ import annotations

from typing import Any

import torch

VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")


def language_uses(trunk: torch.nn.Module, impl: str) -> bool:
    lm = getattr(trunk, "language_model", None)
    return lm is not None and getattr(lm.config, "_attn_implementation", None) == impl


def _features(out: Any) -> torch.Tensor:
    """The merged vision features, whatever form this transformers version returns."""
    pooled = getattr(out, "pooler_output", out)
    if isinstance(pooled, list | tuple):
        return torch.cat(list(pooled), dim=0)
    return pooled


def packed_vision_hidden(trunk: torch.nn.Module, input_ids: torch.Tensor,
                         inputs: dict[str, Any]) -> torch.Tensor:
    """Hidden states [B, T, H] of a packed vision batch under varlen attention."""
    embeds = trunk.get_input_embeddings()(input_ids)
    cfg = trunk.config
    for pixels, grid, token in (("pixel_values", "image_grid_thw", cfg.image_token_id),
                                ("pixel_values_videos", "video_grid_thw", cfg.video_token_id)):
        if inputs.get(pixels) is None:
            continue
        get = trunk.get_image_features if pixels == "pixel_values" else trunk.get_video_features
        feats = _features(get(inputs[pixels], inputs[grid])).to(embeds.dtype)
        mask = (input_ids == token).unsqueeze(-1).expand_as(embeds)
        embeds = embeds.masked_scatter(mask, feats)
    lm_inputs = {k: inputs[k] for k in VARLEN_KEYS if k in inputs}
    out = trunk.language_model(inputs_embeds=embeds, position_ids=inputs["position_ids"],
                               attention_mask=None, use_cache=False, **lm_inputs)
    return out.last_hidden_state
