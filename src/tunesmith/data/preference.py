"""Preference data: pairs (DPO, ORPO, SimPO, reward models) and KTO's labelled samples.

Every preference item is stored as two consecutive samples of one store, so caching,
mixing, splitting and packing work on items exactly as on SFT samples:

    pair (ranking: true)        store[2i] = prompt + chosen    store[2i+1] = prompt + rejected
    KTO desirable (kto_tag)     store[2i] = prompt + answer    store[2i+1] = (empty)
    KTO undesirable             store[2i] = (empty)            store[2i+1] = prompt + answer

A KTO item also carries a mismatched completion for the KL estimate: its own prompt with
the answer of the next item of the same store (built when read, never stored).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tunesmith.data.conversation import Conversation
from tunesmith.data.encode import (
    IGNORE_INDEX,
    EncodedSample,
    EncodeOptions,
    EncodeStats,
    encode_conversations,
)
from tunesmith.data.formats import FormatSpec, RowError
from tunesmith.data.template import ChatRenderer

KTO_TAG = "kto_tag"  # the column key of dataset_info.json "columns" (LLaMA-Factory's name)
PREFERENCE_STAGES = ("dpo", "kto", "rm")
_EMPTY = EncodedSample(np.zeros(0, np.int32), np.zeros(0, np.int32))


@dataclass
class PreferenceItem:
    """One training item: a chosen and/or a rejected completion of one prompt."""

    chosen: EncodedSample | None
    rejected: EncodedSample | None
    kl: EncodedSample | None = None  # KTO: prompt + a mismatched answer
    # reference log-probs, when precomputed once before training (precompute_ref_log_probs)
    ref_chosen: float | None = None
    ref_rejected: float | None = None
    ref_kl: float | None = None

    def completions(self) -> list[tuple[str, EncodedSample]]:
        """(slot, completion) pairs; a KTO item's answer takes the "chosen" slot (its
        label is `chosen is not None`)."""
        if self.kl is not None:
            answer = self.chosen if self.chosen is not None else self.rejected
            return [("chosen", answer), ("kl", self.kl)]  # type: ignore[list-item]
        return [(n, s) for n, s in (("chosen", self.chosen), ("rejected", self.rejected))
                if s is not None]

    def __len__(self) -> int:
        return sum(len(s) for _, s in self.completions())

    @staticmethod
    def collate_items(items: Sequence[Any], pad_id: int) -> Any:
        """Called by data.batching.collate for lists of items (or packed rows of them)."""
        from tunesmith.data.preference_batch import collate_preference  # imports this module

        return collate_preference(items, pad_id)


def read_kto_tag(row: dict[str, Any], spec: FormatSpec) -> bool:
    """The desirable (true) / undesirable (false) label of a KTO row."""
    key = spec.columns[KTO_TAG]
    value = row.get(key)
    if not isinstance(value, bool):
        raise RowError(f"column {key!r} (kto_tag) is {value!r}, expected true (desirable) or "
                       "false (undesirable)")
    return value


def check_stage_data(name: str, spec: FormatSpec, stage: str) -> str | None:
    """Why dataset `name` cannot feed `stage`, or None."""
    kto = KTO_TAG in spec.columns
    if kto and stage != "kto":
        return (f"dataset {name!r} has kto_tag labels (desirable/undesirable answers); stage "
                f"{stage} would train on the undesirable answers too. Use stage: kto, or "
                "another dataset")
    if spec.ranking and stage not in ("dpo", "rm"):
        return (f"dataset {name!r} holds preference pairs (ranking: true); stage {stage} "
                "needs " + ("kto_tag labels" if stage == "kto" else "plain examples")
                + ": use stage dpo or rm, or another dataset")
    if stage in ("dpo", "rm") and not spec.ranking:
        return (f"dataset {name!r} is not a preference dataset; stage {stage} needs pairs: "
                "set ranking: true with chosen/rejected columns in dataset_info.json")
    if stage == "kto" and not kto:
        return (f"dataset {name!r} has no kto_tag column; stage kto needs "
                "\"columns\": {\"kto_tag\": \"label\"} in its dataset_info.json entry")
    return None


def encode_preference(convs: list[Conversation], renderer: ChatRenderer | None, tokenizer: Any,
                      opts: EncodeOptions
                      ) -> tuple[list[EncodedSample], list[str], EncodeStats]:
    """Encode items into consecutive sample slots (see the module docstring); an item whose
    completion was dropped (truncation: drop or error, or no trained token) is dropped
    whole, and counted by the encoder."""
    # Completions are keyed by position: rows of one JSON line can share a source.
    keyed, where = [], {}
    for k, c in enumerate(convs):
        where[f"#{k}"] = c.source
        keyed.append(Conversation(c.messages, c.tools, f"#{k}"))
        if c.rejected is not None:
            where[f"#{k}r"] = f"{c.source} (rejected)"
            keyed.append(Conversation(c.messages[:-1] + [c.rejected], c.tools, f"#{k}r"))
    samples, keys, stats = encode_conversations(keyed, renderer, tokenizer, opts)
    _restore_sources(stats, where)
    by_key = dict(zip(keys, samples, strict=True))
    out: list[EncodedSample] = []
    sources: list[str] = []
    for k, c in enumerate(convs):
        first = by_key.get(f"#{k}")
        if c.rejected is not None:
            pair = (first, by_key.get(f"#{k}r"))
        else:
            pair = (first, _EMPTY) if c.extra.get(KTO_TAG, True) else (_EMPTY, first)
        if any(s is None for s in pair):
            continue
        out += pair  # type: ignore[arg-type]
        sources += [c.source, c.source]
    stats.samples = len(out) // 2
    return out, sources, stats


def _restore_sources(stats: EncodeStats, where: dict[str, str]) -> None:
    stats.dropped_too_long = [where[k] for k in stats.dropped_too_long]
    stats.no_trained_tokens = [where[k] for k in stats.no_trained_tokens]
    stats.bad = [(where[k], reason) for k, reason in stats.bad]


class PreferenceView(Sequence[PreferenceItem]):
    """Items over a store of consecutive sample slots; `lengths` are item lengths."""

    def __init__(self, store: Any, kto: bool = False):
        self.store, self.kto = store, kto
        lengths = np.asarray(store.lengths)
        self.lengths = lengths[0::2] + lengths[1::2]
        if kto:  # the KL completion's length: own prompt + the next item's answer
            self.lengths = self.lengths * 2

    def __len__(self) -> int:
        return len(self.store) // 2

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        a, b = self.store[2 * i], self.store[2 * i + 1]
        item = PreferenceItem(a if len(a) else None, b if len(b) else None)
        if self.kto:
            nxt = self.store[2 * ((i + 1) % len(self))]
            nxt = nxt if len(nxt) else self.store[2 * ((i + 1) % len(self)) + 1]
            item.kl = mismatched_completion(a if len(a) else b, nxt)
        return item

    def source(self, i: int) -> str:
        return self.store.source(2 * i)


def mismatched_completion(own: EncodedSample, other: EncodedSample) -> EncodedSample:
    """`own`'s prompt (tokens before its first trained token) + `other`'s answer."""
    start_own, start_other = _answer_start(own), _answer_start(other)
    ids = np.concatenate([own.input_ids[:start_own], other.input_ids[start_other:]])
    labels = np.concatenate([np.full(start_own, IGNORE_INDEX, np.int32),
                             other.labels[start_other:]])
    return EncodedSample(ids.astype(np.int32), labels.astype(np.int32))


def _answer_start(s: EncodedSample) -> int:
    trained = np.flatnonzero(s.labels != IGNORE_INDEX)
    return int(trained[0]) if len(trained) else len(s)
