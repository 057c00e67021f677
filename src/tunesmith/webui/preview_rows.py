"""How the Data tab shows one row of each kind, rendered through the chat template with the
tokens the loss sees marked:

    SFT row        prompt + answer              answer spans marked "trained"
    pair (dpo/rm)  prompt | chosen | rejected   answers marked "chosen" / "rejected"
    KTO row        label, prompt + answer       answer marked "desirable" / "undesirable"
    media rows     thumbnails (as the processor resizes them) and token counts: vision
                   tokens per image / video, text tokens, total; a missing or broken file
                   is reported with the row's file:line
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tunesmith.data.conversation import Conversation
from tunesmith.data.encode import EncodeOptions, encode_conversations, trained_spans
from tunesmith.data.formats import RowError
from tunesmith.data.preference import KTO_TAG
from tunesmith.data.template import ChatRenderer
from tunesmith.data.vision_tokens import load_media
from tunesmith.webui.i18n import text

Highlighted = list[tuple[str, str | None]]  # (text, category or None)
COLORS = {"trained": "green", "chosen": "green", "rejected": "red", "desirable": "green",
          "undesirable": "red"}


def highlight(renderer: ChatRenderer, conv: Conversation, opts: EncodeOptions,
              label: str = "trained") -> Highlighted:
    """The rendered text cut into trained (`label`) / not-trained pieces."""
    rendered = renderer.render(conv)
    whole, pieces, pos = rendered.text, [], 0
    for lo, hi in trained_spans(rendered.assistant_spans, len(whole), opts):
        if lo > pos:
            pieces.append((whole[pos:lo], None))
        pieces.append((whole[lo:hi], label))
        pos = hi
    if pos < len(whole):
        pieces.append((whole[pos:], None))
    return pieces


def _after(pieces: Highlighted, n: int) -> Highlighted:
    """The pieces from character `n` of their joined text on."""
    out, pos = [], 0
    for s, label in pieces:
        if pos + len(s) > n:
            out.append((s[max(0, n - pos):], label))
        pos += len(s)
    return out


def _prompt_length(pieces: Highlighted) -> int:
    """Characters before the first marked piece."""
    n = 0
    for s, label in pieces:
        if label:
            return n
        n += len(s)
    return n


@dataclass
class PairColumns:
    """A preference pair cut for two columns: the shared prompt, then each answer."""
    source: str
    prompt: str
    chosen: Highlighted
    rejected: Highlighted


def pair_columns(renderer: ChatRenderer, conv: Conversation, opts: EncodeOptions
                 ) -> PairColumns:
    assert conv.rejected is not None
    chosen = highlight(renderer, conv, opts, "chosen")
    other = Conversation(conv.messages[:-1] + [conv.rejected], conv.tools, conv.source)
    rejected = highlight(renderer, other, opts, "rejected")
    c_text, r_text = "".join(s for s, _ in chosen), "".join(s for s, _ in rejected)
    shared = min(_prompt_length(chosen), _prompt_length(rejected),
                 len(os.path.commonprefix([c_text, r_text])))
    return PairColumns(str(conv.source), c_text[:shared], _after(chosen, shared),
                       _after(rejected, shared))


def pair_pieces(renderer: ChatRenderer, conv: Conversation, opts: EncodeOptions,
                lang: str) -> Highlighted:
    """A preference pair: the shared prompt once, then the chosen and rejected answers."""
    cols = pair_columns(renderer, conv, opts)
    return ([(text("data.pair.prompt", lang), None), (cols.prompt, None),
             (text("data.pair.chosen", lang), None)] + cols.chosen
            + [(text("data.pair.rejected", lang), None)] + cols.rejected)


def _marked_html(pieces: Highlighted) -> str:
    return "".join(f"<mark>{html.escape(s)}</mark>" if label else html.escape(s)
                   for s, label in pieces)


def pairs_html(pairs: list[PairColumns], lang: str) -> str:
    """Pairs side by side: the prompt across the top, chosen | rejected below it, the
    tokens the loss sees marked."""
    head = (text("data.pair.prompt", lang), text("data.pair.chosen", lang),
            text("data.pair.rejected", lang))
    prompt_h, chosen_h, rejected_h = (html.escape(h.strip(" \n─")) for h in head)
    cell = "white-space:pre-wrap;vertical-align:top;width:50%;padding:6px"
    out = []
    for p in pairs:
        out.append(
            f'<table class="pair" style="width:100%;table-layout:fixed;margin-bottom:12px">'
            f'<tr><th colspan="2">{html.escape(p.source)} · {prompt_h}</th></tr>'
            f'<tr><td colspan="2" style="{cell}">{html.escape(p.prompt)}</td></tr>'
            f'<tr><th>{chosen_h}</th><th>{rejected_h}</th></tr>'
            f'<tr><td class="chosen" style="{cell}">{_marked_html(p.chosen)}</td>'
            f'<td class="rejected" style="{cell}">{_marked_html(p.rejected)}</td></tr></table>')
    return "".join(out)


def kto_pieces(renderer: ChatRenderer, conv: Conversation, opts: EncodeOptions,
               lang: str) -> Highlighted:
    """A KTO row: its label, then the row with its answer marked desirable / undesirable."""
    good = bool(conv.extra.get(KTO_TAG))
    label = "desirable" if good else "undesirable"
    head = (text("data.kto.desirable", lang, source=conv.source) if good
            else text("data.kto.undesirable", lang, source=conv.source))
    return [(head, None)] + highlight(renderer, conv, opts, label)


def row_pieces(renderer: ChatRenderer, conv: Conversation, opts: EncodeOptions,
               lang: str) -> Highlighted:
    if conv.rejected is not None:
        return pair_pieces(renderer, conv, opts, lang)
    if KTO_TAG in conv.extra:
        return kto_pieces(renderer, conv, opts, lang)
    return highlight(renderer, conv, opts)


@dataclass
class MediaPreview:
    thumbnails: list[tuple[np.ndarray, str]] = field(default_factory=list)  # (RGB, caption)
    rows: list[dict[str, Any]] = field(default_factory=list)  # one per row with media
    errors: list[str] = field(default_factory=list)  # "file:line: reason"


def media_preview(convs: list[Conversation], vision: Any, renderer: ChatRenderer,
                  tokenizer: Any, opts: EncodeOptions, limit: int, lang: str = "en"
                  ) -> MediaPreview:
    """Thumbnails and token counts of the first `limit` rows that carry media."""
    out = MediaPreview()
    with_media = [c for c in convs if c.images or c.videos][:limit]
    whole = replace(opts, cutoff_len=1 << 30)  # the row's own length, before any cut
    if vision is not None:  # as training encodes: vision tokens never trained, kept whole
        whole = replace(whole, vision_ids=tuple(vision.token_ids.values()),
                        media_ids=vision.media_token_ids)
    for conv in with_media:
        if vision is None:
            out.errors.append(f"{conv.source}: {text('data.media.text_model', lang)}")
            continue
        conv = replace(conv, messages=list(conv.messages), extra=dict(conv.extra))
        try:
            items = load_media(conv, vision)
        except RowError as exc:
            out.errors.append(f"{conv.source}: {exc}")
            continue
        samples, _, _ = encode_conversations([conv], renderer, tokenizer, whole)
        total = len(samples[0]) if samples else 0
        per_item = [vision.tokens_of(item.grid(vision)) for item in items]
        for k, (item, n) in enumerate(zip(items, per_item, strict=True)):
            h, w = item.frames.shape[1:3]
            out.thumbnails.append((item.frames[0], f"{n} tokens · {item.kind} {k + 1} · "
                                   f"{w}×{h} · {conv.source}"))
        out.rows.append({"row": conv.source, "media": len(items),
                         "vision_tokens": " + ".join(map(str, per_item)),
                         "text_tokens": total - sum(per_item), "total_tokens": total})
    return out


def media_table(preview: MediaPreview, lang: str) -> str:
    """The token counts as a Markdown table (empty when no row has media)."""
    if not preview.rows:
        return ""
    head = text("data.media.header", lang)
    lines = [f"| {r['row']} | {r['media']} | {r['vision_tokens']} | {r['text_tokens']} "
             f"| {r['total_tokens']} |" for r in preview.rows]
    return "\n".join([head, "|---|---|---|---|---|", *lines])
