"""One generation worker thread fed by a bounded request queue.

The model runs one request at a time, in arrival order, so concurrent requests never share
a generate() call and their outputs cannot mix. Items produced in the worker thread are
handed to the request's event loop; a client that goes away cancels its job, which stops
generation at the next token.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


class QueueFull(Exception):
    """More requests are waiting than the queue holds."""


@dataclass
class _Job:
    make: Callable[[], Iterator[Any]]
    emit: Callable[[tuple[str, Any]], None]
    cancelled: threading.Event = field(default_factory=threading.Event)


class GenerationWorker:
    def __init__(self, max_queue: int = 256):
        self._jobs: queue.Queue[_Job | None] = queue.Queue(maxsize=max_queue)
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
        loop = asyncio.get_running_loop()
        inbox: asyncio.Queue[tuple[str, Any]] = asyncio.Queue()

        def emit(item: tuple[str, Any]) -> None:
            try:
                loop.call_soon_threadsafe(inbox.put_nowait, item)
            except RuntimeError:  # the loop is closed: the server is shutting down
                pass

        job = _Job(make, emit)
        try:
            self._jobs.put_nowait(job)
        except queue.Full:
            raise QueueFull from None
        return _drain(inbox, job)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancelled.is_set():
                continue
            try:
                items = job.make()
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
