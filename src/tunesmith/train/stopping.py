"""Graceful stop: SIGTERM / SIGINT (the web UI's Stop, Ctrl-C) finish the current optimizer
step, write a checkpoint and end the run; every rank stops at the same step."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from tqdm.auto import tqdm

from tunesmith.distributed.context import DistContext, all_reduce_sum


class GracefulStop:
    def __init__(self) -> None:
        self.requested = False

    def request(self) -> None:
        self.requested = True

    def agreed(self, ctx: DistContext) -> bool:
        """Whether to stop now: a signal may reach the ranks at different steps, so every
        rank stops as soon as any one of them was asked to."""
        if not ctx.distributed:
            return self.requested
        return all_reduce_sum([float(self.requested)], ctx)[0] > 0

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT and self.requested:
            raise KeyboardInterrupt  # a second Ctrl-C aborts at once
        name = signal.Signals(signum).name
        tqdm.write(f"{name} received: stopping after this optimizer step with a checkpoint "
                   "(Ctrl-C again aborts without one)")
        self.request()

    @contextmanager
    def handling_signals(self) -> Iterator[None]:
        """SIGTERM/SIGINT -> a graceful stop while inside (main thread only)."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = {sig: signal.signal(sig, self._on_signal)
                    for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
