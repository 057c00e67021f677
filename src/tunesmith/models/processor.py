"""Vision-language models: recognise them, read their processor's geometry, carry the
processor files along with every adapter and export.

The processor files are read as JSON rather than built through `AutoProcessor`: on CPU
machines without torchvision, transformers cannot build Qwen2-VL's video processor, and
tunesmith decodes and patchifies media itself (data/media.py) from these numbers.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tunesmith.config.schema import Config
from tunesmith.errors import ConfigError, ModelError

PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json",
                   "processor_config.json")
# model_type -> mrope temporal rule; other vision-language architectures are refused
VISION_ARCHITECTURES = {"qwen2_vl": "qwen2_vl", "qwen2_5_vl": "qwen2_5_vl",
                        "qwen3_vl": "qwen3_vl"}


@dataclass(frozen=True)
class VisionSettings:
    """Everything that decides a sample's vision tokens and pixels (part of the cache key)."""

    patch_size: int = 14
    merge_size: int = 2
    temporal_patch_size: int = 2
    image_mean: tuple[float, ...] = (0.48145466, 0.4578275, 0.40821073)
    image_std: tuple[float, ...] = (0.26862954, 0.26130258, 0.27577711)
    min_pixels: int = 56 * 56  # the processor's own bounds (smart resize)
    max_pixels: int = 28 * 28 * 1280
    image_max_pixels: int = 768 * 768  # LLaMA-Factory's bounds, applied first
    image_min_pixels: int = 32 * 32
    video_max_pixels: int = 256 * 256
    video_min_pixels: int = 16 * 16
    video_fps: float = 2.0
    video_maxlen: int = 128
    media_dirs: tuple[str, ...] = ()
    image_token: str = "<|image_pad|>"
    video_token: str = "<|video_pad|>"
    vision_start: str = "<|vision_start|>"
    vision_end: str = "<|vision_end|>"
    token_ids: dict[str, int] = field(default_factory=dict)  # the four tokens' ids by name
    time_interval: float = 1.0  # mrope temporal step per video grid (Qwen2.5-VL: > 1)
    architecture: str = "qwen2_vl"  # a key of VISION_ARCHITECTURES

    def cache_settings(self) -> dict[str, Any]:
        return asdict(self)

    def tokens_of(self, grid: tuple[int, int, int]) -> int:
        """Vision tokens of one image/video in the language model: t * h * w / merge^2."""
        t, h, w = grid
        return t * h * w // (self.merge_size ** 2)

    @property
    def media_token_ids(self) -> tuple[int, int]:
        return self.token_ids["image"], self.token_ids["video"]


def model_type_of(path: str | Path) -> str:
    cfg = Path(path) / "config.json"
    if not cfg.is_file():
        return ""
    return str(json.loads(cfg.read_text(encoding="utf-8")).get("model_type", ""))


def is_vision_model(path: str | Path) -> bool:
    cfg = Path(path) / "config.json"
    return cfg.is_file() and "vision_config" in json.loads(cfg.read_text(encoding="utf-8"))


def read_vision_settings(path: str | Path, tokenizer: Any, **keys: Any) -> VisionSettings:
    """The processor geometry of the model folder, with the config's media keys (`keys`:
    image_max_pixels, ..., media_dirs)."""
    folder = Path(path)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    kind = VISION_ARCHITECTURES.get(config.get("model_type", ""))
    if kind is None:
        raise ModelError(f"{folder}: vision-language model type {config.get('model_type')!r} is "
                         f"not supported; supported: {', '.join(VISION_ARCHITECTURES)}")
    pre = folder / "preprocessor_config.json"
    if not pre.is_file():
        raise ModelError(f"{folder}: no preprocessor_config.json (the image processor); copy it "
                         "from the original model folder")
    p = json.loads(pre.read_text(encoding="utf-8"))
    size = p.get("size") or {}
    settings = VisionSettings(
        patch_size=int(p.get("patch_size", 14)), merge_size=int(p.get("merge_size", 2)),
        temporal_patch_size=int(p.get("temporal_patch_size", 2)),
        image_mean=tuple(p.get("image_mean", VisionSettings.image_mean)),
        image_std=tuple(p.get("image_std", VisionSettings.image_std)),
        min_pixels=int(p.get("min_pixels") or size.get("shortest_edge") or 56 * 56),
        max_pixels=int(p.get("max_pixels") or size.get("longest_edge") or 28 * 28 * 1280),
        **keys)
    ids = {name: tokenizer.convert_tokens_to_ids(tok) for name, tok in (
        ("image", settings.image_token), ("video", settings.video_token),
        ("start", settings.vision_start), ("end", settings.vision_end))}
    unknown = [n for n, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if unknown:
        raise ModelError(f"{folder}: the tokenizer lacks the vision token(s) {unknown}; use the "
                         "model's own tokenizer")
    interval = 1.0
    if kind == "qwen2_5_vl":  # temporal step = tokens_per_second * seconds per grid
        tps = float((config.get("vision_config") or {}).get("tokens_per_second", 4))
        interval = tps * settings.temporal_patch_size / settings.video_fps
    return VisionSettings(**{**asdict(settings), "token_ids": ids, "time_interval": interval,
                             "architecture": kind})


def save_processor_files(model_path: str | Path, folder: Path) -> None:
    """Copy the base model's processor files next to an adapter or export."""
    for name in PROCESSOR_FILES:
        src = Path(model_path) / name
        if src.is_file():
            shutil.copyfile(src, folder / name)


def load_vision_settings(model_path: str, tokenizer: Any, cfg: Config
                         ) -> VisionSettings | None:
    """The vision settings of a run: the model's processor geometry plus the multimodal
    keys; None for a text-only model (whose rows with media are then bad rows)."""
    if not is_vision_model(model_path):
        return None
    if cfg.model.attn_implementation == "varlen" and model_type_of(model_path) == "qwen3_vl":
        raise ConfigError("attn_implementation: varlen is not supported for Qwen3-VL yet (its "
                          "deepstack features enter the decoder layers inside the model's own "
                          "forward); use sdpa (packed rows then use a block mask)")
    mm = cfg.multimodal
    dirs = tuple(str(Path(d).resolve()) for d in (mm.media_dir, cfg.data.dataset_dir) if d)
    return read_vision_settings(
        model_path, tokenizer, image_max_pixels=mm.image_max_pixels,
        image_min_pixels=mm.image_min_pixels, video_max_pixels=mm.video_max_pixels,
        video_min_pixels=mm.video_min_pixels, video_fps=mm.video_fps,
        video_maxlen=mm.video_maxlen, media_dirs=dirs)
