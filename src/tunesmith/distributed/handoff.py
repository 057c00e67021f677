"""Rank 0 prepares, the other ranks wait on a file (not on a collective).

Tokenising a large dataset can take longer than `ddp_timeout`; a rank blocked in a
collective meanwhile would be killed by the NCCL watchdog. So:

    all ranks : agree on a fresh run token (one tiny broadcast, right away)
    rank 0    : value <- build(); write  dir/<name>-<token>.pkl  then  .done   (or .failed)
    others    : poll for .done (or .failed) until `timeout_s`; then read the pickle
    all ranks : barrier (everyone has read it); rank 0 deletes the files

The token makes stale files of an earlier run unreadable by mistake. The folder must be
shared by all nodes (output_dir is, for checkpoints to resume).
"""

from __future__ import annotations

import os
import pickle
import secrets
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from tunesmith.distributed.context import DistContext, barrier, broadcast_object
from tunesmith.errors import TrainingError

T = TypeVar("T")
POLL_S = 0.2


def prepare_on_main(build: Callable[[], T], folder: Path, name: str, ctx: DistContext,
                    timeout_s: float) -> T:
    """`build()` on rank 0; every rank returns its result (single process: just build)."""
    if not ctx.distributed:
        return build()
    token = str(broadcast_object(secrets.token_hex(8) if ctx.is_main else None, ctx))
    data, done, failed = (folder / f"{name}-{token}{s}" for s in (".pkl", ".done", ".failed"))
    if ctx.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        try:
            value = build()
        except BaseException as exc:
            failed.write_text(f"{type(exc).__name__}: {exc}", encoding="utf-8")
            raise
        tmp = data.with_suffix(".tmp")
        with open(tmp, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, data)
        done.touch()
    else:
        _wait_for(done, failed, timeout_s, ctx.rank)
        with open(data, "rb") as fh:
            value = pickle.load(fh)  # written by rank 0 of this very run (token above)
    barrier(ctx)
    if ctx.is_main:
        for p in (data, done):
            p.unlink(missing_ok=True)
    return value


def _wait_for(done: Path, failed: Path, timeout_s: float, rank: int) -> None:
    start = time.monotonic()
    while not done.exists():
        if failed.exists():
            raise TrainingError(f"rank {rank}: rank 0 failed while preparing the data: "
                                f"{failed.read_text(encoding='utf-8')}")
        if time.monotonic() - start > timeout_s:
            raise TrainingError(f"rank {rank}: waited {timeout_s:.0f} s for rank 0 to prepare "
                                f"the data ({done} never appeared); raise ddp_timeout for very "
                                "large datasets, and make sure output_dir is on storage that "
                                "every node shares")
        time.sleep(POLL_S)
