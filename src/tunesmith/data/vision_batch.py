"""The vision inputs of a batch: patches concatenated in token order, grids, and the 3-D
rotary positions of every sample (restarting per sample inside packed rows)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from tunesmith.data.encode import EncodedSample
from tunesmith.data.media import patchify
from tunesmith.kernels.mrope import mrope_positions


def has_media(rows: Sequence[Sequence[EncodedSample]]) -> bool:
    return any(s.media for row in rows for s in row)


def vision_fields(rows: Sequence[Sequence[EncodedSample]], t_max: int) -> dict[str, torch.Tensor]:
    """rows: the samples of each batch row, laid left to right from column 0.

    Returns pixel_values [N_img_patches, D], image_grid_thw [n_img, 3], pixel_values_videos,
    video_grid_thw (present only when the batch has that kind) and mrope_position_ids
    [3, B, t_max] int64."""
    vision = next(s.vision for row in rows for s in row if s.vision is not None)
    patches: dict[str, list[np.ndarray]] = {"image": [], "video": []}
    grids: dict[str, list[tuple[int, int, int]]] = {"image": [], "video": []}
    positions = np.zeros((3, len(rows), t_max), dtype=np.int64)
    media_ids = vision.media_token_ids
    for b, row in enumerate(rows):
        start = 0
        for s in row:
            items = s.media or []
            sample_grids = [item.grid(vision) for item in items]
            intervals = [1.0 if it.kind == "image" else vision.time_interval for it in items]
            n = len(s)
            positions[:, b, start:start + n] = mrope_positions(
                s.input_ids, sample_grids, media_ids, vision.merge_size, intervals)
            for item, grid in zip(items, sample_grids, strict=True):
                patches[item.kind].append(patchify(item, vision))
                grids[item.kind].append(grid)
            start += n
        positions[:, b, start:] = np.arange(t_max - start)
    out = {"mrope_position_ids": torch.from_numpy(positions)}
    for kind, key, grid_key in (("image", "pixel_values", "image_grid_thw"),
                                ("video", "pixel_values_videos", "video_grid_thw")):
        if patches[kind]:
            out[key] = torch.from_numpy(np.concatenate(patches[kind]))
            out[grid_key] = torch.tensor(grids[kind], dtype=torch.int64)
    return out
