"""The media of a sample store: resized frames on disk, memory-mapped on reload.

    <folder>/media_frames.bin  uint8 [sum T*H*W*3]   every item's frames, back to back
    <folder>/media_index.npy   int64 [M, 6]          sample, kind (0 image, 1 video),
                                                     byte offset, T, H, W (sorted by sample)
    <folder>/vision.json       the VisionSettings the frames were made with

Only stores of vision-language runs have these files; text stores are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from tunesmith.data.media import MediaItem
from tunesmith.models.processor import VisionSettings

FRAMES_FILE, INDEX_FILE, VISION_FILE = "media_frames.bin", "media_index.npy", "vision.json"
KINDS = ("image", "video")


class MediaWriter:
    """Appends the media of each sample as the store writer appends its tokens."""

    def __init__(self, folder: Path, vision: VisionSettings):
        self.folder, self.vision = folder, vision
        self._frames = open(folder / FRAMES_FILE, "wb")  # noqa: SIM115 (closed in close())
        self._rows: list[list[int]] = []
        self._offset = 0

    def append(self, sample: int, items: Sequence[MediaItem] | None) -> None:
        for item in items or ():
            t, h, w = item.frames.shape[:3]
            self._rows.append([sample, KINDS.index(item.kind), self._offset, t, h, w])
            data = np.ascontiguousarray(item.frames, dtype=np.uint8).tobytes()
            self._frames.write(data)
            self._offset += len(data)

    def close(self) -> None:
        self._frames.close()
        np.save(self.folder / INDEX_FILE, np.asarray(self._rows, np.int64).reshape(-1, 6))
        (self.folder / VISION_FILE).write_text(json.dumps(asdict(self.vision)),
                                               encoding="utf-8")

    def abort(self) -> None:
        self._frames.close()


class MediaTable:
    """Media items of every sample of a store, looked up by sample index."""

    def __init__(self, frames: np.ndarray, index: np.ndarray, vision: VisionSettings):
        self.frames, self.index, self.vision = frames, index, vision

    @classmethod
    def open(cls, folder: Path) -> MediaTable | None:
        if not (folder / VISION_FILE).is_file():
            return None
        index = np.load(folder / INDEX_FILE)
        size = (folder / FRAMES_FILE).stat().st_size
        frames = (np.memmap(folder / FRAMES_FILE, dtype=np.uint8, mode="r", shape=(size,))
                  if size else np.zeros(0, np.uint8))
        return cls(frames, index, vision_from_json(folder / VISION_FILE))

    @classmethod
    def from_samples(cls, samples: Sequence[Any]) -> MediaTable | None:
        """In memory, from EncodedSamples carrying media (None when none does)."""
        vision = next((s.vision for s in samples if s.vision is not None), None)
        if vision is None:
            return None
        rows, chunks, offset = [], [], 0
        for i, s in enumerate(samples):
            for item in s.media or ():
                rows.append([i, KINDS.index(item.kind), offset, *item.frames.shape[:3]])
                chunks.append(item.frames.reshape(-1))
                offset += item.frames.size
        frames = np.concatenate(chunks) if chunks else np.zeros(0, np.uint8)
        return cls(frames, np.asarray(rows, np.int64).reshape(-1, 6), vision)

    def items(self, sample: int) -> list[MediaItem] | None:
        lo, hi = np.searchsorted(self.index[:, 0], [sample, sample + 1])
        if lo == hi:
            return None
        out = []
        for _, kind, offset, t, h, w in self.index[lo:hi].tolist():
            data = np.asarray(self.frames[offset:offset + t * h * w * 3])
            out.append(MediaItem(KINDS[kind], data.reshape(t, h, w, 3)))
        return out


def vision_from_json(path: Path) -> VisionSettings:
    d: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    for key in ("image_mean", "image_std", "media_dirs"):
        d[key] = tuple(d[key])
    return VisionSettings(**d)
