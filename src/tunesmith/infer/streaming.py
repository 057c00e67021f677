"""Token streaming pieces for the engine: a queue-backed streamer, a cancel switch for
`generate`, and the incremental text decoder that applies stop strings.

```
generate thread --put(ids)--> TokenQueue --ids--> TextAssembler --text deltas--> caller
      ^                                                 |
      +------ CancelCriteria (Event) <---- stop string / caller gone
```
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import torch
from transformers.generation import BaseStreamer, StoppingCriteria

_END = object()


class TokenQueue(BaseStreamer):
    """Receives new token ids from `generate` (batch size 1) and hands them to a reader."""

    def __init__(self) -> None:
        self._queue: queue.Queue[Any] = queue.Queue()
        self._prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self._prompt_seen:  # the first call carries the prompt
            self._prompt_seen = True
            return
        self._queue.put(value.reshape(-1).tolist())

    def end(self) -> None:
        self._queue.put(_END)

    def __iter__(self) -> TokenQueue:
        return self

    def __next__(self) -> list[int]:
        item = self._queue.get()
        if item is _END:
            raise StopIteration
        return item


class CancelCriteria(StoppingCriteria):
    """Stops generation as soon as its event is set (stop string found, client gone)."""

    def __init__(self, event: threading.Event) -> None:
        self.event = event

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any
                 ) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), self.event.is_set(), dtype=torch.bool,
                          device=input_ids.device)


def find_stop(text: str, stops: list[str]) -> int | None:
    """Index of the earliest stop string in `text`, or None."""
    hits = [text.find(s) for s in stops if s and s in text]
    return min(hits) if hits else None


def partial_stop_len(text: str, stops: list[str]) -> int:
    """Length of the longest tail of `text` that is a proper prefix of a stop string: that
    tail is held back, since the next token may complete the stop string."""
    best = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:n]):
                best = n
                break
    return best


class TextAssembler:
    """Turns a growing list of token ids into safe-to-show text deltas.

    Text is decoded incrementally: each step decodes only a short window (the last committed
    token(s) plus the new ones) and keeps the part past the window's old text, so pieces that
    only form characters in context (byte-level BPE, SentencePiece spaces) come out right
    while a step costs the same at token 5 and token 5,000. A trailing U+FFFD (an unfinished
    UTF-8 sequence) and any tail that may start a stop string are held back, and a complete
    stop string ends the text before it.
    """

    def __init__(self, tokenizer: Any, stops: list[str], eos_ids: set[int]) -> None:
        self.tokenizer, self.stops, self.eos_ids = tokenizer, stops, eos_ids
        self.ids: list[int] = []
        self.emitted = 0
        self.stopped = False  # a stop string or an end-of-sequence token ended the text
        self._decode = _decoder(tokenizer)
        self._text = ""  # the text of ids[:_read]
        self._prefix = 0  # ids[_prefix:_read]: the context window re-decoded each step
        self._read = 0

    def add(self, new_ids: list[int]) -> str:
        """Append ids; return the text that can be shown now."""
        for i in new_ids:
            if i in self.eos_ids:
                self.stopped = True
                break
            self.ids.append(i)
        text = self._advance(final=False)
        cut = find_stop(text, self.stops)
        if cut is not None:
            self.stopped = True
            return self._take(text, max(cut, self.emitted))
        if self.stopped:
            return self._take(text, len(text))
        safe = len(text) - partial_stop_len(text, self.stops)
        while safe > self.emitted and text[safe - 1] == "\ufffd":
            safe -= 1
        return self._take(text, safe)

    def flush(self) -> str:
        """The held-back tail once generation has ended."""
        text = self._advance(final=True)
        cut = find_stop(text, self.stops)
        return self._take(text, len(text) if cut is None else max(cut, self.emitted))

    def _advance(self, final: bool) -> str:
        """The text of all ids so far; commits the window once it ends on a whole character."""
        if self._read == len(self.ids):
            return self._text
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if not after.startswith(before):  # the window re-reads differently: decode it all
            self._text = self._decode(self.ids)
            self._read = len(self.ids)
            self._prefix = max(0, self._read - 4)
            return self._text
        if not final and (len(after) <= len(before) or after.endswith("\ufffd")):
            # nothing new yet (special tokens) or half a character: keep the window where it
            # is, anchored on a real token, until the text moves on
            return self._text + after[len(before):]
        self._text += after[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        return self._text

    def _take(self, text: str, upto: int) -> str:
        piece = text[self.emitted:upto]
        self.emitted = max(self.emitted, upto)
        return piece


def _decoder(tokenizer: Any) -> Any:
    """ids -> text without special tokens: the Rust tokenizer itself when transformers would
    add nothing to it (no clean-up of spaces), which halves the cost of a small decode."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
