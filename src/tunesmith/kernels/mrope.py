"""3-D rotary positions (mrope) of Qwen2-VL-style models, per sample, on the host.

Text tokens advance all three axes together; the tokens of an image or video take
(temporal, height, width) grid coordinates offset by the position where the span starts,
and the text after it resumes at start + max(h, w) / merge (transformers' rule).

    ids:   txt txt [img img img img] txt
    t:      0   1    2   2   2   2    4
    h:      0   1    2   2   3   3    4
    w:      0   1    2   3   2   3    4

Computed per sample, so packed rows restart at 0 for every sample (the model's own
`get_rope_index` would number a packed row as one sequence).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def mrope_positions(ids: np.ndarray, grids: Sequence[tuple[int, int, int]],
                    media_ids: Sequence[int], merge: int,
                    intervals: Sequence[float] | None = None) -> np.ndarray:
    """[3, len(ids)] int64 positions of one sample. `grids`: (t, h, w) in patches of each
    image/video span in order; `intervals`: temporal step of each (1.0 by default)."""
    n = len(ids)
    pos = np.empty((3, n), dtype=np.int64)
    is_media = np.isin(ids, np.asarray(media_ids))
    edges = np.flatnonzero(np.diff(np.r_[0, is_media.astype(np.int8), 0]))
    runs = list(zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True))
    if len(runs) != len(grids):
        raise ValueError(f"{len(runs)} vision spans in the tokens but {len(grids)} grids")
    cur, done = 0, 0
    for k, ((lo, hi), (t, h, w)) in enumerate(zip(runs, grids, strict=True)):
        pos[:, done:lo] = np.arange(lo - done) + cur
        cur += lo - done
        lh, lw = h // merge, w // merge
        if hi - lo != t * lh * lw:
            raise ValueError(f"vision span {k} has {hi - lo} tokens, its grid {t}x{h}x{w} "
                             f"needs {t * lh * lw}")
        step = 1.0 if intervals is None else intervals[k]
        tt, hh, ww = np.meshgrid((np.arange(t) * step).astype(np.int64), np.arange(lh),
                                 np.arange(lw), indexing="ij")
        pos[:, lo:hi] = np.stack([tt.ravel(), hh.ravel(), ww.ravel()]) + cur
        cur += max(lh, lw)
        done = hi
    pos[:, done:] = np.arange(n - done) + cur
    return pos
