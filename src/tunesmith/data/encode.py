"""Conversations -> token ids + labels (loss mask), with truncation that is always counted.

Token ids are those of tokenising the full rendered text once (as `apply_chat_template`
does), and a token is trained when its characters overlap a trained character span (so a
token straddling the start of an answer, such as " The" after "Assistant:", is trained).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tunesmith.data.conversation import Conversation
from tunesmith.data.template import ChatRenderer, Span
from tunesmith.errors import DataError

IGNORE_INDEX = -100


@dataclass
class EncodeOptions:
    cutoff_len: int
    truncation: str = "truncate_prompt"  # truncate_prompt | drop | error
    train_on_prompt: bool = False
    mask_history: bool = False


@dataclass
class EncodedSample:
    input_ids: np.ndarray  # [T] int32
    labels: np.ndarray  # [T] int32, IGNORE_INDEX where not trained

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class EncodeStats:
    samples: int = 0
    truncated_prompt: int = 0
    truncated_response: int = 0
    dropped_too_long: list[str] = field(default_factory=list)
    no_trained_tokens: list[str] = field(default_factory=list)
    trained_tokens: int = 0
    total_tokens: int = 0

    def merge(self, other: EncodeStats) -> None:
        for name in ("samples", "truncated_prompt", "truncated_response", "trained_tokens",
                     "total_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.dropped_too_long += other.dropped_too_long
        self.no_trained_tokens += other.no_trained_tokens


def trained_spans(rendered_spans: list[Span], text_len: int, opts: EncodeOptions) -> list[Span]:
    if opts.train_on_prompt:
        return [(0, text_len)]
    if opts.mask_history:
        return rendered_spans[-1:]
    return rendered_spans


def encode_conversations(convs: list[Conversation], renderer: ChatRenderer, tokenizer: Any,
                         opts: EncodeOptions) -> tuple[list[EncodedSample], EncodeStats]:
    """Render, tokenise in one batch, build labels, apply the truncation policy."""
    rendered = [renderer.render(c) for c in convs]
    texts = [r.text for r in rendered]
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
    stats = EncodeStats()
    out: list[EncodedSample] = []
    for conv, r, ids, offsets in zip(convs, rendered, enc["input_ids"], enc["offset_mapping"],
                                     strict=True):
        ids = np.asarray(ids, dtype=np.int32)
        starts = np.fromiter((o[0] for o in offsets), dtype=np.int64, count=len(offsets))
        trained = np.zeros(len(ids), dtype=bool)
        for lo, hi in trained_spans(r.assistant_spans, len(r.text), opts):
            trained |= (starts >= lo) & (starts < hi)
        sample = _truncate(conv, ids, trained, opts, stats)
        if sample is None:
            continue
        n_trained = int((sample.labels != IGNORE_INDEX).sum())
        if n_trained == 0:
            stats.no_trained_tokens.append(conv.source)
            continue
        stats.samples += 1
        stats.trained_tokens += n_trained
        stats.total_tokens += len(sample)
        out.append(sample)
    return out, stats


def _truncate(conv: Conversation, ids: np.ndarray, trained: np.ndarray, opts: EncodeOptions,
              stats: EncodeStats) -> EncodedSample | None:
    cutoff = opts.cutoff_len
    if len(ids) > cutoff:
        if opts.truncation == "error":
            raise DataError(f"{conv.source}: sample has {len(ids)} tokens, more than cutoff_len "
                            f"{cutoff}; raise cutoff_len or set truncation: truncate_prompt/drop")
        if opts.truncation == "drop":
            stats.dropped_too_long.append(conv.source)
            return None
        ids, trained = _truncate_keep_last_response(ids, trained, cutoff, stats)
    labels = np.where(trained, ids, IGNORE_INDEX).astype(np.int32)
    return EncodedSample(ids, labels)


def _truncate_keep_last_response(ids: np.ndarray, trained: np.ndarray, cutoff: int,
                                 stats: EncodeStats) -> tuple[np.ndarray, np.ndarray]:
    """Cut the prompt in its middle (keeping its head and the turn header right before the
    last response); cut the response's tail only when the response alone is too long."""
    idx = np.flatnonzero(trained)
    if len(idx) == 0:
        stats.truncated_prompt += 1
        return ids[:cutoff], trained[:cutoff]
    # start of the last trained run
    breaks = np.flatnonzero(np.diff(idx) > 1)
    last_start = int(idx[breaks[-1] + 1]) if len(breaks) else int(idx[0])
    prompt_len, response_len = last_start, len(ids) - last_start
    if response_len >= cutoff - min(prompt_len, 16):
        keep_prompt = min(prompt_len, 16)
        stats.truncated_response += 1
        keep = np.r_[np.arange(keep_prompt), np.arange(last_start, last_start + cutoff
                                                       - keep_prompt)]
    else:
        budget = cutoff - response_len
        head = budget // 4
        tail = budget - head
        stats.truncated_prompt += 1
        keep = np.r_[np.arange(head), np.arange(prompt_len - tail, len(ids))]
    return ids[keep], trained[keep]
