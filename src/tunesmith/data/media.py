"""Images and videos of a vision-language dataset: find, decode, resize, patchify.

    path (relative to media_dir / dataset_dir) --Pillow | PyAV | frame list--> RGB frames
    --LLaMA-Factory's pixel bounds (image_/video_ max/min_pixels)--> --smart resize to a
    multiple of patch x merge--> MediaItem: uint8 frames [T, H, W, 3] + grid (t, h, w)

Decoding runs in the preprocessing workers and the resized frames go into the cache, so
training only normalises and patchifies (`patchify`, Qwen2-VL's patch layout, checked
against transformers' image processor in the tests). No torchvision is needed: videos are
decoded with PyAV (the `vision` extra) or given as lists of frame images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from tunesmith.data.formats import RowError
from tunesmith.models.processor import VisionSettings

MediaKind = Literal["image", "video"]
VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".m4v", ".gif")


@dataclass
class MediaItem:
    kind: MediaKind
    frames: np.ndarray  # [T, H, W, 3] uint8, H and W multiples of patch_size * merge_size

    def grid(self, s: VisionSettings) -> tuple[int, int, int]:
        n, h, w = self.frames.shape[:3]
        t = 1 if self.kind == "image" else math.ceil(n / s.temporal_patch_size)
        return t, h // s.patch_size, w // s.patch_size


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int
                 ) -> tuple[int, int]:
    """Nearest size with both sides multiples of `factor` and the area within bounds,
    keeping the aspect ratio (Qwen2-VL's rule)."""
    if max(height, width) / min(height, width) > 200:
        raise RowError(f"aspect ratio {max(height, width) / min(height, width):.0f} is above "
                       "200; crop the media")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def resolve_media(value: Any, s: VisionSettings) -> Path:
    """A media path from the data: absolute, or relative to media_dir / dataset_dir."""
    if isinstance(value, dict) and "path" in value:
        value = value["path"]
    if not isinstance(value, str) or not value:
        raise RowError(f"media entry {value!r} is not a file path")
    path = Path(value).expanduser()
    candidates = [path] if path.is_absolute() else [Path(d) / path for d in s.media_dirs]
    candidates.append(path)
    for cand in candidates:
        if cand.is_file():
            return cand
    looked = ", ".join(str(c) for c in candidates)
    raise RowError(f"media file {value!r} not found (looked at {looked}); set media_dir to "
                   "the folder the paths are relative to")


def _open_image(path: Path) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as img:
            img.load()
            return img.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as exc:
        raise RowError(f"image {str(path)!r} cannot be decoded ({exc}); replace or remove "
                       "it") from None


def _fit_pixels(img: Any, max_pixels: int, min_pixels: int) -> Any:
    """LLaMA-Factory's bounds: scale down above max_pixels, up below min_pixels."""
    w, h = img.size
    if w * h > max_pixels or w * h < min_pixels:
        scale = math.sqrt((max_pixels if w * h > max_pixels else min_pixels) / (w * h))
        img = img.resize((max(1, int(w * scale)), max(1, int(h * scale))))
    return img


def _to_grid_size(frames: list[Any], s: VisionSettings) -> np.ndarray:
    from PIL import Image

    w, h = frames[0].size
    factor = s.patch_size * s.merge_size
    new_h, new_w = smart_resize(h, w, factor, s.min_pixels, s.max_pixels)
    arrays = [np.asarray(f.resize((new_w, new_h), Image.Resampling.BICUBIC)
                         if f.size != (new_w, new_h) else f, dtype=np.uint8) for f in frames]
    return np.stack(arrays)  # [T, H, W, 3]


def load_image(value: Any, s: VisionSettings) -> MediaItem:
    """A path from the data, or an already decoded PIL image (inference, the API)."""
    img = value.convert("RGB") if hasattr(value, "convert") and hasattr(value, "size") \
        else _open_image(resolve_media(value, s))
    img = _fit_pixels(img, s.image_max_pixels, s.image_min_pixels)
    return MediaItem("image", _to_grid_size([img], s))


def load_video(value: Any, s: VisionSettings) -> MediaItem:
    """A video file (PyAV) or a list of frame image paths (already sampled)."""
    if isinstance(value, list):
        if not value:
            raise RowError("a video given as a frame list has no frames")
        frames = [_open_image(resolve_media(v, s)) for v in value]
        frames = [frames[i] for i in _even_indices(len(frames), s.video_maxlen)]
    else:
        frames = _decode_video(resolve_media(value, s), s)
    frames = [_fit_pixels(f, s.video_max_pixels, s.video_min_pixels) for f in frames]
    if len(frames) % s.temporal_patch_size:  # whole temporal patches: repeat the last frame
        frames += [frames[-1]] * (s.temporal_patch_size - len(frames) % s.temporal_patch_size)
    return MediaItem("video", _to_grid_size(frames, s))


def _even_indices(total: int, wanted: int) -> list[int]:
    if total <= wanted:
        return list(range(total))
    return np.linspace(0, total - 1, wanted).round().astype(int).tolist()


def _decode_video(path: Path, s: VisionSettings) -> list[Any]:
    try:
        import av
    except ImportError:
        raise RowError(f"video {str(path)!r} needs PyAV to decode: pip install "
                       "'tunesmith[vision]' (or give the video as a list of frame images)"
                       ) from None
    try:
        with av.open(str(path)) as container:
            stream = container.streams.video[0]
            frames = [f.to_image() for f in container.decode(stream)]
            seconds = float(stream.duration * stream.time_base) if stream.duration else 0.0
    except (av.error.FFmpegError, IndexError, OSError) as exc:  # type: ignore[attr-defined]
        raise RowError(f"video {str(path)!r} cannot be decoded ({exc})") from None
    if not frames:
        raise RowError(f"video {str(path)!r} holds no frames")
    seconds = seconds or len(frames) / float(stream.average_rate or 1)
    wanted = max(1, min(s.video_maxlen, math.floor(seconds * s.video_fps)))
    return [frames[i].convert("RGB") for i in _even_indices(len(frames), wanted)]


def patchify(item: MediaItem, s: VisionSettings) -> np.ndarray:
    """Normalised patches in Qwen2-VL's order: [t*h*w, 3 * temporal_patch * patch^2] fp32.

    Rows run over (t, h / merge, w / merge, merge, merge), so each merge x merge block of
    patches is contiguous, which is what the vision tower's merger expects."""
    frames = item.frames.astype(np.float32) / 255.0  # [T, H, W, C]
    frames = (frames - np.asarray(s.image_mean, np.float32)) / np.asarray(s.image_std, np.float32)
    x = frames.transpose(0, 3, 1, 2)  # [T, C, H, W]
    tp, ps, m = s.temporal_patch_size, s.patch_size, s.merge_size
    if item.kind == "image":
        x = np.repeat(x, tp, axis=0)
    t, (gt, gh, gw) = x.shape[0], item.grid(s)
    assert t == gt * tp, "video frames are padded to whole temporal patches when loaded"
    c = x.shape[1]
    x = x.reshape(gt, tp, c, gh // m, m, ps, gw // m, m, ps)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * ps * ps))
