"""Child side of the kill campaign: `python tools/faults.py child PHASE K <tunesmith args>`
arms a SIGKILL at the K-th event of PHASE in this process, then runs the tunesmith CLI.

The hooks wrap tunesmith's own functions (never third-party code), in this child only.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from typing import Any


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _counting(real: Callable[..., Any], k: int, *, after: bool) -> Callable[..., Any]:
    seen = [0]

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        seen[0] += 1
        if seen[0] == k and not after:
            _die()
        out = real(*args, **kwargs)
        if seen[0] == k and after:
            _die()
        return out
    return wrapped


def _data_prep(k: int) -> None:  # the k-th row read
    from tunesmith.data import loading
    real_read = loading.read_rows

    def read(*args: Any, **kwargs: Any) -> Any:
        for i, row in enumerate(real_read(*args, **kwargs), start=1):
            if i == k:
                _die()
            yield row
    loading.read_rows = read


def _cache_write(k: int) -> None:  # before publishing the samples / before the report
    from tunesmith.data import loading, store
    if k % 2:
        store.StoreWriter.close = _counting(store.StoreWriter.close, 1, after=False)
    else:
        loading.write_report_atomically = _counting(loading.write_report_atomically, 1,
                                                    after=False)


def _mid_step(k: int) -> None:  # after backward, before the optimizer step
    from tunesmith.distributed.strategy import Strategy
    Strategy.finish_step = _counting(Strategy.finish_step, k, after=False)


def _checkpoint_write(k: int) -> None:  # before / after the k-th file of any checkpoint
    from tunesmith.train import checkpoint
    checkpoint.write_part = _counting(checkpoint.write_part, k, after=k % 2 == 0)


def _export(k: int) -> None:  # weights written, tokenizer not yet / tokenizer written
    from tunesmith.export import hf_folder
    hf_folder.write_tokenizer = _counting(hf_folder.write_tokenizer, 1, after=k % 2 == 0)


def _enospc_checkpoint(k: int) -> None:  # disk full at the k-th checkpoint file
    import errno

    from tunesmith.train import checkpoint
    real, seen = checkpoint.write_part, [0]

    def full(path: Any, writer: Any) -> None:
        seen[0] += 1
        if seen[0] == k:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, writer)
    checkpoint.write_part = full


PHASES: dict[str, Callable[[int], None]] = {
    "data_prep": _data_prep, "cache_write": _cache_write, "mid_step": _mid_step,
    "checkpoint_write": _checkpoint_write, "export": _export,
    "enospc_checkpoint": _enospc_checkpoint, "timer": lambda k: None}


def arm(phase: str, k: int) -> None:
    """Install the SIGKILL for `phase` at event `k` (1-based)."""
    if phase not in PHASES:
        raise SystemExit(f"unknown phase {phase!r}; one of {sorted(PHASES)}")
    PHASES[phase](k)


def child_main(argv: list[str]) -> int:
    phase, k, rest = argv[0], int(argv[1]), argv[2:]
    arm(phase, k)
    from tunesmith.cli.main import main

    return main(rest)
