"""Conversations -> token ids + labels (loss mask), with truncation that is always counted.

Token ids are those of tokenising the full rendered text once (as `apply_chat_template`
does), and a token is trained when its characters overlap a trained character span (so a
token straddling the start of an answer, such as " The" after "Assistant:", is trained).
Plain text (stage pt) is tokenised as text + EOS, every token trained, and a text longer
than cutoff_len is split into several samples (counted) instead of being cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tunesmith.data.conversation import Conversation
from tunesmith.data.slot_renderer import SlotRenderer
from tunesmith.data.template import ChatRenderer, Span
from tunesmith.data.tokens import trained_mask
from tunesmith.errors import DataError

IGNORE_INDEX = -100


@dataclass
class EncodeOptions:
    cutoff_len: int
    truncation: str = "truncate_prompt"  # truncate_prompt | drop | error
    train_on_prompt: bool = False
    mask_history: bool = False
    plain_text: bool = False  # stage pt: no template, every token trained
    vision_ids: tuple[int, ...] = ()  # vision tokens (pads, start, end): never trained
    media_ids: tuple[int, ...] = ()  # image/video pad ids: a sample's spans must stay whole
    preference: bool = False  # stages dpo/kto/rm: items of two slots (data/preference.py)


@dataclass
class EncodedSample:
    input_ids: np.ndarray  # [T] int32
    labels: np.ndarray  # [T] int32, IGNORE_INDEX where not trained
    media: list[Any] | None = None  # media.MediaItem in token order (vision models)
    vision: Any = None  # processor.VisionSettings of the media

    def __len__(self) -> int:
        return len(self.input_ids)


@dataclass
class EncodeStats:
    samples: int = 0
    truncated_prompt: int = 0
    truncated_response: int = 0
    split_texts: int = 0  # stage pt: long texts split into several samples
    dropped_too_long: list[str] = field(default_factory=list)
    no_trained_tokens: list[str] = field(default_factory=list)
    dropped_vision_cut: list[str] = field(default_factory=list)  # cutoff fell inside media
    bad: list[tuple[str, str]] = field(default_factory=list)  # (where, reason) -> bad rows
    trained_tokens: int = 0
    total_tokens: int = 0

    def merge(self, other: EncodeStats) -> None:
        for name in ("samples", "truncated_prompt", "truncated_response", "split_texts",
                     "trained_tokens", "total_tokens"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.dropped_too_long += other.dropped_too_long
        self.no_trained_tokens += other.no_trained_tokens
        self.dropped_vision_cut += other.dropped_vision_cut
        self.bad += other.bad

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> EncodeStats:
        stats = cls(**{k: v for k, v in d.items() if k != "bad"})
        stats.bad = [tuple(x) for x in d.get("bad", [])]  # type: ignore[misc]
        return stats


def trained_spans(rendered_spans: list[Span], text_len: int, opts: EncodeOptions) -> list[Span]:
    if opts.train_on_prompt:
        return [(0, text_len)]
    if opts.mask_history:
        return rendered_spans[-1:]
    return rendered_spans


def encode_conversations(convs: list[Conversation],
                         renderer: ChatRenderer | SlotRenderer | None,
                         tokenizer: Any, opts: EncodeOptions
                         ) -> tuple[list[EncodedSample], list[str], EncodeStats]:
    """Render, tokenise in one batch, build labels, apply the truncation policy.

    Returns the samples, the location of each, and the counts of what was changed."""
    if not convs:  # a chunk whose every row was bad: tokenizers fail on an empty batch
        return [], [], EncodeStats()
    if opts.plain_text:
        return _encode_plain(convs, tokenizer, opts)
    assert renderer is not None
    if isinstance(renderer, SlotRenderer):
        return _encode_slots(convs, renderer, opts)
    stats = EncodeStats()
    rendered, kept = [], []
    for c in convs:
        try:
            rendered.append(renderer.render(c))
            kept.append(c)
        except DataError as exc:  # the template refused this conversation: a bad row
            stats.bad.append((c.source, str(exc)))
    convs = kept
    spans = [trained_spans(r.assistant_spans, len(r.text), opts) for r in rendered]
    placed = renderer.placer.place([r.text for r in rendered], spans)
    out: list[EncodedSample] = []
    sources: list[str] = []
    for conv, (ids, bounds), sp in zip(convs, placed, spans, strict=True):
        trained = trained_mask(bounds, sp)
        if opts.vision_ids:
            trained &= ~np.isin(ids, opts.vision_ids)
        sample = _truncate(conv, ids, trained, opts, stats)
        if sample is not None and not _media_whole(sample, conv, opts):
            stats.dropped_vision_cut.append(conv.source)
        elif sample is not None:
            sample.media = conv.extra.get("media") or None
            _keep(sample, conv.source, out, sources, stats)
    return out, sources, stats


def _encode_slots(convs: list[Conversation], renderer: SlotRenderer, opts: EncodeOptions
                  ) -> tuple[list[EncodedSample], list[str], EncodeStats]:
    """LLaMA-Factory templates: ids and labels per turn, exactly as LLaMA-Factory makes them
    (its truncation rule for truncate_prompt: see slot_encode.infer_seqlen)."""
    stats = EncodeStats()
    out: list[EncodedSample] = []
    sources: list[str] = []
    for conv, ids, labels in renderer.encode(convs, opts, stats):
        _keep(EncodedSample(ids, labels), conv.source, out, sources, stats)
    return out, sources, stats


def _media_whole(sample: EncodedSample, conv: Conversation, opts: EncodeOptions) -> bool:
    """Truncation kept every vision token of the sample (a cut inside an image or video
    span would leave the model fewer tokens than the vision tower gives it)."""
    expected = conv.extra.get("vision_tokens", 0)
    if not opts.media_ids:
        return True
    return int(np.isin(sample.input_ids, opts.media_ids).sum()) == expected


def _keep(sample: EncodedSample, source: str, out: list[EncodedSample], sources: list[str],
          stats: EncodeStats) -> None:
    n_trained = int((sample.labels != IGNORE_INDEX).sum())
    if n_trained == 0:
        stats.no_trained_tokens.append(source)
        return
    stats.samples += 1
    stats.trained_tokens += n_trained
    stats.total_tokens += len(sample)
    out.append(sample)
    sources.append(source)


def _encode_plain(convs: list[Conversation], tokenizer: Any, opts: EncodeOptions
                  ) -> tuple[list[EncodedSample], list[str], EncodeStats]:
    eos = tokenizer.eos_token or ""
    enc = tokenizer([c.messages[0].content + eos for c in convs], add_special_tokens=False)
    stats = EncodeStats()
    out: list[EncodedSample] = []
    sources: list[str] = []
    step = opts.cutoff_len
    for conv, ids in zip(convs, enc["input_ids"], strict=True):
        ids = np.asarray(ids, dtype=np.int32)
        if len(ids) > step:
            stats.split_texts += 1
        for k, lo in enumerate(range(0, len(ids), step)):
            piece = ids[lo:lo + step]
            where = conv.source if k == 0 else f"{conv.source} (part {k + 1})"
            _keep(EncodedSample(piece, piece.copy()), where, out, sources, stats)
    return out, sources, stats


def _truncate(conv: Conversation, ids: np.ndarray, trained: np.ndarray, opts: EncodeOptions,
              stats: EncodeStats) -> EncodedSample | None:
    cutoff = opts.cutoff_len
    if len(ids) > cutoff:
        if opts.truncation == "error":
            stats.bad.append((conv.source, f"sample has {len(ids)} tokens, more than "
                                   f"cutoff_len {cutoff} (truncation: error); raise cutoff_len "
                                   "or set truncation: truncate_prompt or drop"))
            return None
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
