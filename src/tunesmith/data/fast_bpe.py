"""A faster exact path for GPT-2-style byte-level BPE tokenizers, through tiktoken.

A Hugging Face byte-level BPE tokenizer (ByteLevel pre-tokenizer with the GPT-2 split
pattern, no normaliser, plain merges) is rebuilt as a tiktoken Encoding: the GPT-2 pattern,
every single byte and every merge result ranked by merge order, the added tokens as
special tokens. tiktoken's BPE merges the pair whose result ranks lowest, which equals
merging in merge order when each token comes from one merge; instead of trusting that, the
encoder checks itself against the Hugging Face tokenizer on the data it sees (every text of
the first CHECK_FULL texts, then one text in CHECK_EVERY) and switches itself off for good
at the first difference. Anything not matching these conditions keeps the Rust tokenizer.

tiktoken is optional (extra `fast`); without it this path is simply not used.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import numpy as np

log = logging.getLogger(__name__)
GPT2_PATTERN = (r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+"""
                r"""|\s+(?!\S)|\s+""")
CHECK_FULL, CHECK_EVERY = 2000, 100


def _byte_of_char() -> dict[str, int]:
    """GPT-2's printable stand-in character of every byte (the ByteLevel alphabet)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
            *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _is_plain_byte_level(spec: dict[str, Any]) -> bool:
    model, pre = spec.get("model") or {}, spec.get("pre_tokenizer") or {}
    return (model.get("type") == "BPE" and not model.get("byte_fallback")
            and not model.get("dropout") and not model.get("continuing_subword_prefix")
            and not model.get("end_of_word_suffix") and not model.get("ignore_merges")
            and spec.get("normalizer") is None and pre.get("type") == "ByteLevel"
            and pre.get("use_regex", True) and not pre.get("add_prefix_space"))


def _specials(spec: dict[str, Any]) -> dict[str, int] | None:
    out = {}
    for tok in spec.get("added_tokens") or []:
        if tok.get("lstrip") or tok.get("rstrip") or tok.get("single_word") or \
                tok.get("normalized") and not tok.get("special"):
            return None  # matching rules tiktoken does not have
        out[tok["content"]] = tok["id"]
    return out


class FastBPE:
    """tiktoken encoding of one byte-level BPE tokenizer, self-checking."""

    def __init__(self, encoding: Any, id_of_rank: np.ndarray, backend: Any, identity: bool):
        self.encoding, self.id_of_rank, self.backend = encoding, id_of_rank, backend
        self.identity = identity  # ranks are the ids (no mapping)
        self.seen = 0
        self.enabled = True
        self.has_unknown_bytes = bool((id_of_rank[:256] < 0).any())
        self.known = int(id_of_rank.max()) + 1  # ids at or past this stand for unknown bytes

    def encode_batch(self, texts: list[str]) -> list[list[int]] | None:
        """Ids of every text, or None when this path has switched itself off."""
        if not self.enabled:
            return None
        encode = self.encoding.encode  # per text: encode_batch adds a thread pool's overhead
        ranks = [encode(t, allowed_special="all") for t in texts]
        if self.identity:
            out = ranks
        else:
            out = [self.id_of_rank[np.asarray(r, dtype=np.int64)].tolist() for r in ranks]
        if self.has_unknown_bytes:  # the tokenizer drops bytes its vocabulary lacks
            out = [[i for i in ids if 0 <= i < self.known] for ids in out]
        check = [i for i in range(len(texts))
                 if self.seen + i < CHECK_FULL or (self.seen + i) % CHECK_EVERY == 0]
        self.seen += len(texts)
        if check:
            ref = self.backend.encode_batch([texts[i] for i in check], add_special_tokens=False)
            for i, r in zip(check, ref, strict=True):
                if out[i] != r.ids:
                    log.info("fast BPE differs from the tokenizer on a text; using the "
                             "tokenizer from now on")
                    self.enabled = False
                    return None
        return out


def _merge_ranks(spec: dict[str, Any]) -> tuple[dict[bytes, int], list[int]] | None:
    """Ranks of every byte and merge result (in merge order) and the id of each rank."""
    byte_of = _byte_of_char()
    char_of = {b: c for c, b in byte_of.items()}
    vocab: dict[str, int] = spec["model"]["vocab"]
    ranks: dict[bytes, int] = {}
    id_of: list[int] = []
    for b in range(256):
        ranks[bytes([b])] = len(id_of)
        id_of.append(vocab.get(char_of[b], -1))  # a byte the vocabulary never saw: dropped
    try:
        for merge in spec["model"]["merges"]:
            a, b = merge.split(" ", 1) if isinstance(merge, str) else merge
            merged = bytes(byte_of[c] for c in a + b)
            if merged not in ranks:
                ranks[merged] = len(id_of)
                id_of.append(vocab[a + b])
    except KeyError:  # a merge result missing from the vocabulary
        return None
    return ranks, id_of


def build_fast_bpe(tokenizer: Any) -> FastBPE | None:
    """A FastBPE for this tokenizer, or None (not byte-level BPE, or tiktoken missing)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    try:
        import tiktoken
    except ImportError:
        return None
    spec = json.loads(backend.to_str())
    specials = _specials(spec)
    if not _is_plain_byte_level(spec) or specials is None:
        return None
    found = _merge_ranks(spec)
    if found is None:
        return None
    ranks, id_of = found
    vocab: dict[str, int] = spec["model"]["vocab"]
    special_ranks = {}
    for content, tid in specials.items():
        special_ranks[content] = len(id_of)
        id_of.append(tid)
    id_of_rank = np.asarray(id_of, dtype=np.int64)
    merged = id_of_rank[256:len(id_of) - len(special_ranks)]
    identity = bool(np.all(np.diff(merged) > 0))
    if identity:  # ids grow with merge order: the ids themselves serve as ranks
        unknown = int(max(max(vocab.values()), *specials.values(), 0)) + 1
        ranks = {b: int(id_of_rank[r]) if id_of_rank[r] >= 0 else unknown + r
                 for b, r in ranks.items()}
        special_ranks = dict(specials)
    enc = tiktoken.Encoding("tunesmith-bpe", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                            special_tokens=special_ranks)
    return FastBPE(enc, id_of_rank, backend, identity)
