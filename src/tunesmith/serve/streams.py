"""The bridge between request handlers (asyncio) and the continuous batcher (its own thread).

Every choice of every request is one batcher request; chunks emitted in the engine thread
are handed to the request's event loop. A client that goes away cancels its requests (their
rows leave the running batch at the next step).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

from tunesmith.infer.batcher import ContinuousBatcher, EngineBusy
from tunesmith.infer.engine import Chunk, GenerationParams
from tunesmith.serve.worker import QueueFull

Job = tuple[list[int], GenerationParams]


class BatcherStreams:
    """Opens streams of Chunks on a ContinuousBatcher from inside an event loop."""

    def __init__(self, batcher: ContinuousBatcher):
        self.batcher = batcher

    @property
    def largest_batch(self) -> int:
        return self.batcher.stats.largest_batch

    def close(self) -> None:
        self.batcher.close()

    def open_stream(self, prompt: list[int], params: GenerationParams
                    ) -> AsyncIterator[Chunk]:
        """One prompt's chunks. Raises QueueFull at once when too many requests wait."""
        return _only_chunks(self.open_many([(prompt, params)]))

    def open_many(self, jobs: list[Job]) -> AsyncIterator[tuple[int, Chunk]]:
        """(job index, chunk) of several jobs generated side by side in the running batch."""
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[int, str, Any]] = asyncio.Queue()
        events: list[threading.Event] = []
        try:
            for index, (prompt, params) in enumerate(jobs):
                events.append(self.batcher.submit(prompt, params, _emitter(loop, inbox, index)))
        except EngineBusy:
            for event in events:
                event.set()
            raise QueueFull from None
        return _drain(inbox, events)


def _emitter(loop: asyncio.AbstractEventLoop, inbox: asyncio.Queue, index: int) -> Any:
    def emit(kind: str, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(inbox.put_nowait, (index, kind, value))
        except RuntimeError:  # the loop is closed: the server is shutting down
            pass

    return emit


async def _drain(inbox: asyncio.Queue, events: list[threading.Event]
                 ) -> AsyncIterator[tuple[int, Chunk]]:
    open_jobs = len(events)
    try:
        while open_jobs:
            index, kind, value = await inbox.get()
            if kind == "item":
                yield index, value
            elif kind == "error":
                raise value
            else:
                open_jobs -= 1
    finally:
        for event in events:
            event.set()  # no-op for finished jobs; cancels the rest


async def _only_chunks(items: AsyncIterator[tuple[int, Chunk]]) -> AsyncIterator[Chunk]:
    try:
        async for _, chunk in items:
            yield chunk
    finally:
        await items.aclose()  # type: ignore[attr-defined]
