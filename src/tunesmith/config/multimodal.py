"""The `multimodal` config section: media sizes, video sampling and which parts of a
vision-language model train. Names and defaults are LLaMA-Factory's."""

from __future__ import annotations

from dataclasses import dataclass

from tunesmith.config.schema import opt


@dataclass
class MultimodalConfig:
    media_dir: str = opt(
        "", "Folder that relative image/video paths of the data are resolved against "
            "(empty: dataset_dir).")
    image_max_pixels: int = opt(
        768 * 768, "Images larger than this (width x height) are scaled down before the "
        "processor.", minimum=1)
    image_min_pixels: int = opt(32 * 32, "Images smaller than this are scaled up.", minimum=1)
    video_max_pixels: int = opt(256 * 256, "Largest video frame (width x height).", minimum=1)
    video_min_pixels: int = opt(16 * 16, "Smallest video frame (width x height).", minimum=1)
    video_fps: float = opt(2.0, "Frames sampled per second of video.", minimum=0,
                           exclusive_min=True)
    video_maxlen: int = opt(128, "Most frames sampled from one video.", minimum=1)
    freeze_vision_tower: bool = opt(
        True, "Vision-language models: keep the vision encoder frozen (no LoRA on it either).")
    freeze_multi_modal_projector: bool = opt(
        True, "Vision-language models: keep the projector (vision -> language) frozen.")
    freeze_language_model: bool = opt(
        False, "Vision-language models: freeze the language model (train only the unfrozen "
        "vision parts).")
