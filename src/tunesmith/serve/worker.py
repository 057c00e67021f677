"""One generation worker thread fed by a bounded request queue, with dynamic batching: the
server's path for models the continuous batcher cannot serve (e.g. sliding-window attention).

The model runs one generate() call at a time. Single streams that wait in the queue with
the same sampling settings are taken together (up to max_batch) into one left-padded,
batched stream; every other job runs alone, in arrival order. Each token is routed to its
own request by row, so outputs cannot mix. Items produced in the worker thread are handed
to the request's event loop; a client that goes away cancels its job (its row is dropped,
and generation stops once no row is left).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tunesmith.infer.engine import GenerationParams, HFEngine

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """More requests are waiting than the queue holds."""


@dataclass
class _Job:
    emit: Callable[[tuple[str, Any]], None]
    make: Callable[[], Iterator[Any]] | None = None  # a job that runs alone
    stream: tuple[list[int], GenerationParams] | None = None  # a batchable single stream
    cancelled: threading.Event = field(default_factory=threading.Event)

    def batch_key(self) -> tuple | None:
        """Jobs with equal keys can share one generate call (seeded ones never do)."""
        if self.stream is None or self.stream[1].seed is not None:
            return None
        p = self.stream[1]
        return (p.temperature, p.top_p, p.top_k, p.repetition_penalty)


class GenerationWorker:
    def __init__(self, engine: HFEngine, max_queue: int = 256, max_batch: int = 16):
        self.engine, self.max_batch = engine, max_batch
        self.largest_batch = 0  # for tests and diagnostics
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=max_queue)
        self._held: collections.deque[_Job | None] = collections.deque()  # taken, not batched
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name="tunesmith-worker")
        self._thread.start()

    def close(self) -> None:
        """Finish the running job and stop the thread."""
        self._jobs.put(None)
        self._thread.join(timeout=30)

    def open(self, make: Callable[[], Iterator[Any]]) -> AsyncIterator[Any]:
        """Queue `make` (called in the worker thread; its iterator's items are streamed back).

        Raises QueueFull at once, before any response is started, when the queue is full.
        Must be called from the event loop that will consume the returned iterator.
        """
        return self._submit(lambda emit: _Job(emit, make=make))

    def open_stream(self, prompt: list[int], params: GenerationParams) -> AsyncIterator[Any]:
        """Queue one prompt's stream of Chunks; it may run batched with other streams."""
        return self._submit(lambda emit: _Job(emit, stream=(prompt, params)))

    def open_many(self, jobs: list[tuple[list[int], GenerationParams]]
                  ) -> AsyncIterator[tuple[int, Any]]:
        """(job index, Chunk) of several jobs, streamed one after the other."""
        engine = self.engine

        def make() -> Iterator[tuple[int, Any]]:
            for index, (prompt, params) in enumerate(jobs):
                with contextlib.closing(engine.stream_ids(prompt, params)) as chunks:
                    for chunk in chunks:
                        yield index, chunk

        return self.open(make)

    def _submit(self, build: Callable[[Callable], _Job]) -> AsyncIterator[Any]:
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, item)
            except RuntimeError:  # the loop is closed: the server is shutting down
                pass

        job = build(emit)
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        return _drain(inbox, job)

    def _next(self, block: bool) -> _Job | None:
        if self._held:
            return self._held.popleft()
        return self._jobs.get() if block else self._jobs.get_nowait()

    def _loop(self) -> None:
        while True:
            job = self._next(block=True)
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            if job.make is not None:
                _run_alone(job)
            else:
                self._run_batch(self._gather(job))

    def _gather(self, first: _Job) -> list[_Job]:
        """`first` plus the waiting streams that can share its generate call."""
        group, key = [first], first.batch_key()
        if key is None:
            return group
        skipped: list[_Job | None] = []
        while len(group) < self.max_batch:
            try:
                job = self._next(block=False)
            except queue.Empty:
                break
            if job is not None and job.batch_key() == key and not job.cancelled.is_set():
                group.append(job)
            else:
                skipped.append(job)
        self._held.extendleft(reversed(skipped))  # they keep their turn
        return group

    def _run_batch(self, group: list[_Job]) -> None:
        self.largest_batch = max(self.largest_batch, len(group))
        prompts = [job.stream[0] for job in group]  # type: ignore[index]
        params = [job.stream[1] for job in group]  # type: ignore[index]
        try:
            rows = self.engine.stream_batch(prompts, params, [j.cancelled for j in group])
            for i, chunk in rows:
                group[i].emit(("item", chunk))
                if chunk.finish_reason is not None:
                    group[i].emit(("end", None))
        except Exception as exc:  # every request of the batch answers with the error
            for job in group:
                job.emit(("error", exc))


def _run_alone(job: _Job) -> None:
    try:
        items = job.make()  # type: ignore[misc]
        try:
            for item in items:
                if job.cancelled.is_set():
                    break
                job.emit(("item", item))
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()  # stops generation when we left early
        job.emit(("end", None))
    except Exception as exc:  # handed to the request, which answers with an error
        job.emit(("error", exc))


async def _drain(inbox: asyncio.Queue[tuple[str, Any]], job: _Job) -> AsyncIterator[Any]:
    try:
        while True:
            kind, value = await inbox.get()
            if kind == "item":
                yield value
            elif kind == "error":
                raise value
            else:
                return
    finally:
        job.cancelled.set()
