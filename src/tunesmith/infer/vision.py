"""Prompts with images for a vision-language engine.

A message may carry `images`: file paths or decoded PIL images, one per `<image>`
placeholder in its content (placeholders missing from the text are put in front of it).
They go through the training path (data/media.py, vision_tokens.py), so a prompt's
vision tokens and pixels are exactly those a training sample of the same image gets.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import torch

from tunesmith.data.conversation import Conversation, Message
from tunesmith.data.encode import EncodedSample
from tunesmith.data.formats import RowError
from tunesmith.data.vision_batch import vision_fields
from tunesmith.data.vision_tokens import IMAGE_PLACEHOLDER, load_media
from tunesmith.errors import ConfigError
from tunesmith.models.processor import VisionSettings


def has_images(messages: list[dict[str, Any]]) -> bool:
    return any(m.get("images") for m in messages)


def encode_vision_prompt(messages: list[dict[str, Any]], renderer: Any, tokenizer: Any,
                         vision: VisionSettings | None, model: torch.nn.Module
                         ) -> tuple[list[int], dict[str, torch.Tensor]]:
    """Prompt ids and the extra `generate` inputs (pixels, grids, token types)."""
    if vision is None:
        raise ConfigError("this model is text-only: it cannot take images; use a "
                          "vision-language model (Qwen2-VL, Qwen2.5-VL, Qwen3-VL)")
    msgs, images = [], []
    for m in messages:
        content, shown = str(m.get("content") or ""), list(m.get("images") or [])
        missing = len(shown) - content.count(IMAGE_PLACEHOLDER)
        if missing > 0:
            content = IMAGE_PLACEHOLDER * missing + content
        msgs.append(Message(m["role"], content))
        images += shown
    conv = Conversation(msgs, images=images)
    try:
        items = load_media(conv, vision)
    except RowError as exc:
        raise ConfigError(f"image: {exc}") from None
    text = renderer.prompt_text(conv.dicts())
    ids = np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=np.int64)
    fields = vision_fields([[EncodedSample(ids, ids, items, vision)]], len(ids))
    extra = {k: v for k, v in fields.items() if k != "mrope_position_ids"}
    if "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        image_id, video_id = vision.media_token_ids
        types = np.where(ids == image_id, 1, np.where(ids == video_id, 2, 0))
        extra["mm_token_type_ids"] = torch.from_numpy(types)[None]
    return ids.tolist(), extra
