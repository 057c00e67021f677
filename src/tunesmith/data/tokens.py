"""Tokenise rendered texts and place every token in the text (for the loss mask).

The general path asks the tokenizer for offset mappings. For byte-level BPE tokenizers
(GPT-2 style: SmolLM, Llama 3, Qwen without a normaliser, ...) the text's UTF-8 bytes are
exactly the tokens' bytes laid end to end, so a table of per-token byte lengths places
every token with one cumulative sum, and the faster offset-free batch encoder can be used.
The fast path is checked against the offset path on the first texts it sees and switches
itself off if they ever disagree; a text whose bytes do not add up also falls back.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

Placed = tuple[np.ndarray, np.ndarray]  # ids [T] int32, char bounds [T, 2] int64 (start, end)
Span = tuple[int, int]
CHECK_TEXTS = 16


class TokenPlacer:
    """Tokenises texts into ids and per-token character bounds."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.backend = getattr(tokenizer, "backend_tokenizer", None)
        self.byte_lengths = _byte_length_table(self.backend) if self.backend else None
        self.checked = 0

    def place(self, texts: list[str], spans: list[list[Span]]) -> list[Placed]:
        """Ids and bounds of every text; `spans` (the trained character spans of each text)
        serve only to check the fast path against the offset path."""
        if not texts:
            return []
        if self.byte_lengths is None:
            return self._with_offsets(texts)
        encodings = self._encode_fast(texts)
        placed: list[Placed] = []
        for text, ids in zip(texts, encodings, strict=True):
            bounds = self._bounds_from_bytes(text, ids)
            placed.append((ids, bounds) if bounds is not None else self._with_offsets([text])[0])
        if self.checked < CHECK_TEXTS:
            self._check(texts[:CHECK_TEXTS], spans[:CHECK_TEXTS], placed[:CHECK_TEXTS])
        return placed

    def _encode_fast(self, texts: list[str]) -> list[np.ndarray]:
        encode = getattr(self.backend, "encode_batch_fast", self.backend.encode_batch)
        return [np.asarray(e.ids, dtype=np.int32)
                for e in encode(texts, add_special_tokens=False)]

    def _bounds_from_bytes(self, text: str, ids: np.ndarray) -> np.ndarray | None:
        lengths = self.byte_lengths[ids]
        ends = np.cumsum(lengths)
        raw = text.encode("utf-8")
        if len(ids) and ends[-1] != len(raw) or (not len(ids) and raw):
            return None
        starts = ends - lengths
        if len(raw) != len(text):  # non-ASCII: map byte positions to character positions
            char_of_byte = np.repeat(np.arange(len(text)),
                                     [len(c.encode("utf-8")) for c in text])
            char_of_byte = np.append(char_of_byte, len(text))
            starts, ends = char_of_byte[starts], char_of_byte[ends - 1] + 1
        return np.stack([starts, ends], axis=1).astype(np.int64)

    def _with_offsets(self, texts: list[str]) -> list[Placed]:
        enc = self.tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True)
        return [(np.asarray(ids, dtype=np.int32),
                 np.asarray(offsets, dtype=np.int64).reshape(-1, 2))
                for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"], strict=True)]

    def _check(self, texts: list[str], spans: list[list[Span]], fast: list[Placed]) -> None:
        slow = self._with_offsets(texts)
        for (ids_f, b_f), (ids_s, b_s), sp in zip(fast, slow, spans, strict=True):
            if not (np.array_equal(ids_f, ids_s)
                    and np.array_equal(trained_mask(b_f, sp), trained_mask(b_s, sp))):
                self.byte_lengths = None  # this tokenizer needs offset mappings
                return
        self.checked += len(texts)


def trained_mask(bounds: np.ndarray, spans: list[Span]) -> np.ndarray:
    """Tokens whose characters overlap a trained span. bounds: [T, 2] -> [T] bool."""
    trained = np.zeros(len(bounds), dtype=bool)
    for lo, hi in spans:
        trained |= (bounds[:, 0] < hi) & (bounds[:, 1] > lo)
    return trained


def _byte_length_table(backend: Any) -> np.ndarray | None:
    """Byte length of every token id, or None when the tokenizer is not byte-level BPE."""
    try:
        spec = json.loads(backend.to_str())
    except Exception:  # a backend that cannot describe itself: use offsets
        return None
    decoder = (spec.get("decoder") or {}).get("type")
    if decoder != "ByteLevel" or spec.get("normalizer") is not None:
        return None
    vocab = backend.get_vocab(with_added_tokens=True)
    table = np.zeros(max(vocab.values()) + 1, dtype=np.int64)
    for token, i in vocab.items():
        table[i] = len(token)  # byte-level alphabet: one character per byte
    for i, added in backend.get_added_tokens_decoder().items():
        table[i] = len(added.content.encode("utf-8"))
    return table
