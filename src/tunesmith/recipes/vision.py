"""The vision settings of a run: the model's processor geometry plus the multimodal keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError
from tunesmith.models.processor import VisionSettings, is_vision_model, read_vision_settings


def load_vision_settings(model_path: str, tokenizer: Any, cfg: Config
                         ) -> VisionSettings | None:
    """None for a text-only model (whose rows with media are then bad rows)."""
    if not is_vision_model(model_path):
        return None
    if cfg.model.attn_implementation == "varlen":
        raise ConfigError("attn_implementation: varlen does not reach the vision tower yet; use "
                          "sdpa for a vision-language model (packed rows use a block mask)")
    mm = cfg.multimodal
    dirs = tuple(str(Path(d).resolve()) for d in (mm.media_dir, cfg.data.dataset_dir) if d)
    return read_vision_settings(
        model_path, tokenizer, image_max_pixels=mm.image_max_pixels,
        image_min_pixels=mm.image_min_pixels, video_max_pixels=mm.video_max_pixels,
        video_min_pixels=mm.video_min_pixels, video_fps=mm.video_fps,
        video_maxlen=mm.video_maxlen, media_dirs=dirs)
