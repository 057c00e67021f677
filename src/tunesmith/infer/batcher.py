"""Continuous batching: requests join and leave the running batch between decode steps.

```
submit(prompt, params, emit) --waiting queue--> engine thread, per iteration:
  take waiting requests while slots are free
  prefill one group (right-padded, <= prefill_tokens) into the slots behind the batch
      --> first token of each (sampled) --> emit
  decode one token for every running request (rows = slots 0..B-1, each at its own
      position; DecodeRunner: CUDA graph or eager) --> per-row sampling --> emit
  finished / cancelled rows leave; the last row moves into the hole (batch stays packed)
```

Each request streams `Chunk`s through its `emit` callback (called in the engine thread)
exactly like `HFEngine.stream_ids`: stop strings, end-of-sequence, max_new_tokens and
cancellation are per request, and so are temperature, top-p, top-k, repetition penalty and
seed. The model is the engine's transformers model; only its attention function is switched
(through transformers' public `set_attn_implementation`) to the slot attention, and back
by the engine's own generate() when that runs (both under the engine's lock).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from tunesmith.errors import ModelError
from tunesmith.infer.decode_graphs import DecodeRunner
from tunesmith.infer.engine import Chunk, GenerationParams, HFEngine, RowText, advance_row
from tunesmith.infer.kv_slots import (
    STATE_KWARG,
    DecodeState,
    PrefillState,
    SlotCache,
    cache_shape,
    plan_slots,
    register_slot_attention,
)
from tunesmith.infer.sampling import RowSampling, choose_tokens
from tunesmith.infer.streaming import TextAssembler
from tunesmith.models.loader import split_causal_lm

log = logging.getLogger(__name__)

Emit = Callable[[str, Any], None]  # ("item", Chunk) | ("end", None) | ("error", exception)


class EngineBusy(Exception):
    """More requests are waiting than the batcher accepts."""


@dataclass
class BatcherOptions:
    max_batch: int = 16  # running requests at most (fewer when the GPU memory is short)
    max_len: int = 0  # tokens per request (prompt + completion); 0: the model's context
    max_waiting: int = 0  # requests waiting for a slot at most; 0: no limit
    memory_fraction: float = 0.85  # share of free GPU memory the KV cache may take
    cuda_graphs: bool = True  # replay decode steps from CUDA graphs (CUDA only)
    prefill_tokens: int = 0  # padded prompt tokens per prefill group; 0: 8192 GPU, 2048 CPU


@dataclass
class _Live:
    """One request in the batcher."""

    prompt: list[int]
    emit: Emit
    cancelled: threading.Event
    row: RowText
    sampling: RowSampling
    length: int = 0  # tokens in its cache slot
    last: int = 0  # the token fed at the next decode step
    ended: bool = False  # its last chunk was emitted


@dataclass
class BatcherStats:
    largest_batch: int = 0
    decode_steps: int = 0
    prefill_groups: int = 0
    joined_running: int = 0  # requests prefilled while others were decoding
    cancelled: int = 0
    finished: int = 0


class ContinuousBatcher:
    """Serves many streams at once over one model and a preallocated slot KV cache."""

    def __init__(self, engine: HFEngine, options: BatcherOptions | None = None):
        opts = options or BatcherOptions()
        self.engine, self.options = engine, opts
        self.model = engine.model
        self.trunk, self.head = split_causal_lm(self.model)
        dtype = next(self.model.parameters()).dtype
        self.max_len = opts.max_len or engine.max_length or 4096
        shape = cache_shape(self.model.config, dtype, self.max_len)
        slots = plan_slots(shape, self.max_len, opts.max_batch, engine.device,
                           opts.memory_fraction)
        self.cache = SlotCache(shape.layers, slots, shape.kv_heads, self.max_len,
                               shape.head_dim, dtype, engine.device)
        size = slots * self.max_len * shape.bytes_per_token / 2**30
        log.info("KV cache: %d slots of %d tokens (%.2f GiB) on %s", slots, self.max_len, size,
                 engine.device)
        if slots < opts.max_batch:
            log.warning("the KV cache holds %d running requests, not max_batch_size %d: the "
                        "free memory allows no more at %d tokens each (lower --max_model_len "
                        "or raise --kv_cache_fraction for more)", slots, opts.max_batch,
                        self.max_len)
        self.attention = register_slot_attention()
        self.runner = DecodeRunner(self._decode_logits, self.cache, engine.device,
                                   opts.cuda_graphs)
        vocab = self.head.weight.shape[0]
        self.seen = torch.zeros((slots, vocab), dtype=torch.bool, device=engine.device)
        self.prefill_tokens = opts.prefill_tokens or (
            8192 if engine.device.type == "cuda" else 2048)
        self.stats = BatcherStats()
        self._rows: list[_Live] = []
        self._pending: list[_Live] = []
        self._waiting: queue.Queue[_Live | None] = queue.Queue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="tunesmith-batcher")
        self._thread.start()

    @property
    def slots(self) -> int:
        return self.cache.slots

    # -- requests ---------------------------------------------------------------------------
    def submit(self, prompt: list[int], params: GenerationParams, emit: Emit,
               cancelled: threading.Event | None = None) -> threading.Event:
        """Queue one request; returns its cancel event (set it to drop the request)."""
        need = len(prompt) + params.max_new_tokens - 1
        if not prompt or need > self.max_len:
            raise ModelError(f"a prompt of {len(prompt)} tokens plus max_new_tokens "
                             f"{params.max_new_tokens} does not fit a cache slot of "
                             f"{self.max_len} tokens; shorten the prompt or lower max_tokens")
        if self.options.max_waiting and self._waiting.qsize() >= self.options.max_waiting:
            raise EngineBusy
        event = cancelled or threading.Event()
        text = TextAssembler(self.engine.tokenizer, params.stop, self.engine.eos_ids)
        gen = None
        if params.seed is not None:
            gen = torch.Generator(self.engine.device).manual_seed(params.seed)
        sampling = RowSampling(params.temperature, params.top_p, params.top_k,
                               params.repetition_penalty, gen)
        self._waiting.put(_Live(list(prompt), emit, event,
                                RowText(text, params.max_new_tokens), sampling))
        return event

    def stream(self, prompt: list[int], params: GenerationParams) -> Iterator[Chunk]:
        """Submit one request now; iterate its chunks in the caller's thread. Closing the
        iterator cancels the request."""
        inbox: queue.Queue[tuple[str, Any]] = queue.Queue()
        cancel = self.submit(prompt, params, lambda kind, value: inbox.put((kind, value)))
        return _read(inbox, cancel)

    def waiting(self) -> int:
        return self._waiting.qsize()

    def close(self) -> None:
        self._closed = True
        self._waiting.put(None)
        self._thread.join(timeout=30)

    # -- the engine thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._closed:
            self._take_waiting(block=not self._rows and not self._pending)
            if self._closed:
                break
            try:
                with self.engine._lock, torch.inference_mode():
                    self.engine.use_attention(self.attention)  # generate() switches it back
                    self._iterate()
            except Exception as exc:  # every request in flight answers with the error
                log.error("continuous batching step failed: %s", type(exc).__name__,
                          exc_info=exc)
                for live in self._rows + self._pending:
                    live.emit("error", exc)
                self._rows, self._pending = [], []
        for live in self._rows + self._pending:
            live.emit("error", ModelError("the server is shutting down"))

    def _take_waiting(self, block: bool) -> None:
        while len(self._rows) + len(self._pending) < self.slots:
            try:
                live = self._waiting.get(block=block)
            except queue.Empty:
                return
            if live is None:
                self._closed = True
                return
            block = False
            if live.cancelled.is_set():
                self.stats.cancelled += 1
            else:
                self._pending.append(live)

    def _iterate(self) -> None:
        self._take_waiting(block=False)  # requests that came while we waited for the lock
        self._leave([i for i, r in enumerate(self._rows) if r.cancelled.is_set()])
        if self._pending:
            self._prefill(self._prefill_group())
        if self._rows:
            self._decode()

    def _prefill_group(self) -> list[_Live]:
        """The first pending requests whose right-padded prompts fit the token budget."""
        group: list[_Live] = []
        for live in self._pending:
            width = max(len(x.prompt) for x in [*group, live])
            if group and width * (len(group) + 1) > self.prefill_tokens:
                break
            group.append(live)
        self._pending = self._pending[len(group):]
        return [g for g in group if not g.cancelled.is_set()]

    def _prefill(self, group: list[_Live]) -> None:
        """Write the group's prompts into the slots behind the batch; emit first tokens."""
        if not group:
            return
        first, m = len(self._rows), len(group)
        if first:
            self.stats.joined_running += m
        width = max(len(g.prompt) for g in group)
        dev = self.engine.device
        pad = self.engine.tokenizer.pad_token_id or 0
        ids = torch.tensor([g.prompt + [pad] * (width - len(g.prompt)) for g in group],
                           device=dev)  # [m, T]
        pos = torch.arange(width, device=dev).expand(m, width)
        hidden = self.trunk(input_ids=ids, position_ids=pos, use_cache=False,
                            **{STATE_KWARG: PrefillState(self.cache, first)}).last_hidden_state
        lengths = torch.tensor([len(g.prompt) for g in group], device=dev)
        logits = self.head(hidden[torch.arange(m, device=dev), lengths - 1])  # [m, V]
        self.seen[first:first + m] = False
        for i, g in enumerate(group):
            self.seen[first + i, torch.tensor(g.prompt, device=dev)] = True
            g.length = len(g.prompt)
        self._rows.extend(group)
        self.stats.prefill_groups += 1
        self._advance(first, choose_tokens(logits, [g.sampling for g in group],
                                           self.seen[first:first + m]))

    def _decode_logits(self, ids: torch.Tensor, state: DecodeState) -> torch.Tensor:
        """The decode step (eager, or captured by the runner): ids [B, 1] -> logits [B, V]."""
        out = self.trunk(input_ids=ids, position_ids=state.pos[:, None], use_cache=False,
                         **{STATE_KWARG: state})
        return self.head(out.last_hidden_state[:, 0])

    def _decode(self) -> None:
        rows = self._rows
        self.stats.largest_batch = max(self.stats.largest_batch, len(rows))
        self.stats.decode_steps += 1
        logits = self.runner.run([r.last for r in rows], [r.length for r in rows])
        chosen = choose_tokens(logits, [r.sampling for r in rows], self.seen[:len(rows)])
        for r in rows:
            r.length += 1
        self._advance(0, chosen)

    def _advance(self, first: int, tokens: list[int]) -> None:
        """Hand each row its new token (rows first..first+len-1), then let finished ones go."""
        dev = self.engine.device
        index = torch.arange(first, first + len(tokens), device=dev)
        self.seen[index, torch.tensor(tokens, device=dev)] = True
        done = []
        for i, token in enumerate(tokens, start=first):
            live = self._rows[i]
            live.last = token
            for _, chunk in advance_row(i, live.row, token, live.cancelled):
                live.emit("item", chunk)
                if chunk.finish_reason is not None:
                    live.emit("end", None)
                    live.ended = True
                    self.stats.finished += 1
            if live.row.done:
                done.append(i)
        self._leave(done)

    def _leave(self, indexes: list[int]) -> None:
        """Drop rows; the last running row moves into each hole, so rows stay 0..B-1."""
        for i in sorted(indexes, reverse=True):
            if not self._rows[i].ended:
                self.stats.cancelled += 1
            last = len(self._rows) - 1
            if i != last:
                moved = self._rows[last]
                self.cache.move(last, i, moved.length)
                self.seen[i] = self.seen[last]
                self._rows[i] = moved
            self._rows.pop()


def _read(inbox: queue.Queue[tuple[str, Any]], cancel: threading.Event) -> Iterator[Chunk]:
    try:
        while True:
            kind, value = inbox.get()
            if kind == "error":
                raise value
            if kind == "end":
                return
            yield value
    finally:
        cancel.set()
