"""Figures and a rendered sample for `tunesmith data inspect`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from tunesmith.data.encode import IGNORE_INDEX, EncodedSample
from tunesmith.data.loading import PreparedData
from tunesmith.data.packing import PackedSamples

PERCENTILES = (50, 90, 99)


def sample_lengths(samples: Sequence[EncodedSample]) -> np.ndarray:
    lengths = getattr(samples, "lengths", None)
    if lengths is not None:
        return np.asarray(lengths)
    return np.array([len(s) for s in samples], dtype=np.int64)


def describe(data: PreparedData, cutoff_len: int) -> dict[str, Any]:
    """Counts, token-length percentiles, truncation and (would-be) packing figures."""
    lengths = sample_lengths(data.train)
    out: dict[str, Any] = dict(data.report.summary())
    out["train_samples"], out["val_samples"] = len(data.train), len(data.val)
    if len(lengths):
        for p in PERCENTILES:
            out[f"length_p{p}"] = int(np.percentile(lengths, p))
        out["length_max"] = int(lengths.max())
        out["padding_efficiency_bs8"] = round(_padded_efficiency(lengths, 8), 4)
        out.update(PackedSamples(data.train, lengths, cutoff_len).stats())
    return out


def _padded_efficiency(lengths: np.ndarray, batch: int) -> float:
    """Real tokens / slots when batches of `batch` samples (in file order) are padded."""
    slots = sum(int(lengths[i:i + batch].max()) * len(lengths[i:i + batch])
                for i in range(0, len(lengths), batch))
    return float(lengths.sum()) / slots if slots else 0.0


def highlight_sample(sample: EncodedSample, tokenizer: Any, color: bool) -> str:
    """The sample's text with trained tokens in green (ANSI) or between [[ and ]]."""
    on, off = ("\033[32m", "\033[0m") if color else ("[[", "]]")
    trained = sample.labels != IGNORE_INDEX
    pieces: list[str] = []
    start = 0
    for i in range(1, len(trained) + 1):
        if i == len(trained) or trained[i] != trained[start]:
            text = tokenizer.decode(sample.input_ids[start:i].tolist())
            pieces.append(f"{on}{text}{off}" if trained[start] else text)
            start = i
    return "".join(pieces)
