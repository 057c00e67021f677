"""The decode step of the continuous batcher, eager or replayed from CUDA graphs.

A decode step has a fixed shape per (batch bucket, key span), so on CUDA each shape is
captured once into a CUDA graph over static input tensors and replayed afterwards: one
launch instead of a few hundred small kernels per step. Capture happens the first time a
shape is used. If capturing fails (a model whose forward synchronises with the host, an
old driver), the reason is logged once, counted in `fallbacks`, and that step and all later
ones run eagerly.

```
tokens [B], positions [B] --copy--> static ids [Bb, 1], pos [Bb] (rows B..Bb-1: free slots
   at position 0) --graph(Bb, span).replay()--> static logits [Bb, V] --[:B]--> sampler
```
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from tunesmith.infer.kv_slots import DecodeState, SlotCache

log = logging.getLogger(__name__)

StepFn = Callable[[torch.Tensor, DecodeState], torch.Tensor]  # ids [B, 1] -> logits [B, V]


class DecodeRunner:
    """Runs `step` for a batch of B rows, through CUDA graphs when `graphs` is on."""

    def __init__(self, step: StepFn, cache: SlotCache, device: torch.device, graphs: bool,
                 span_step: int = 128):
        self.step, self.cache, self.device = step, cache, device
        self.graphs_on = graphs and device.type == "cuda"
        self.span_step = span_step
        self.fallbacks = 0  # graph captures that failed (then eager from there on)
        self.captured: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        n = cache.slots
        self._ids = torch.zeros((n, 1), dtype=torch.long, device=device)
        self._pos = torch.zeros(n, dtype=torch.long, device=device)
        self._pool: object | None = None

    def buckets(self, rows: int, longest: int) -> tuple[int, int]:
        """(batch rows run, key span read) for `rows` requests whose longest will hold
        `longest` tokens after this step. Graph mode rounds rows up to a power of two."""
        span = min(self.cache.length, -(-longest // self.span_step) * self.span_step)
        if not self.graphs_on:
            return rows, span
        return min(self.cache.slots, 1 << (rows - 1).bit_length()), span

    def run(self, tokens: list[int], positions: list[int]) -> torch.Tensor:
        """Logits [B, V] of the next token of each row (rows are slots 0..B-1)."""
        b = len(tokens)
        width, span = self.buckets(b, max(positions) + 1)
        pad = width - b
        self._ids[:width, 0].copy_(torch.tensor(tokens + [0] * pad), non_blocking=True)
        self._pos[:width].copy_(torch.tensor(positions + [0] * pad), non_blocking=True)
        if self.graphs_on:
            graph = self._graph(width, span)
            if graph is not None:
                graph[0].replay()
                return graph[1][:b]
        state = DecodeState(self.cache, self._pos[:width], span)
        return self.step(self._ids[:width], state)[:b]

    def _graph(self, width: int, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        key = (width, span)
        if key not in self.captured:
            try:
                self.captured[key] = self._capture(width, span)
            except Exception as exc:  # eager from now on, said once and counted
                self.fallbacks += 1
                self.graphs_on = False
                log.warning("CUDA graph capture of the decode step failed (%s: %s); decoding "
                            "eagerly from now on", type(exc).__name__, exc)
                return None
        return self.captured[key]

    def _capture(self, width: int, span: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        ids, pos = self._ids[:width], self._pos[:width]
        state = DecodeState(self.cache, pos, span)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        # Warm-up on a side stream so lazy initialisations stay out of the capture. It runs
        # this very step (same rows and positions), so the keys it writes are the ones the
        # replay writes again.
        with torch.cuda.stream(side):
            self.step(ids, state)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            logits = self.step(ids, state)
        return graph, logits
