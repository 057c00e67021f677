"""Disk-full errors that name the path, the free space and what was kept.

Every writer of a run (checkpoints, the tokenised cache, exports, metrics) wraps its writes
in `disk_guard`, so ENOSPC / EDQUOT end the run with one clear message instead of a
traceback from deep inside safetensors or numpy.
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tunesmith.errors import StorageError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


def is_disk_full(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in DISK_FULL


def free_space(path: Path) -> str:
    """Free bytes on the file system holding `path` (its nearest existing parent), in words."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = shutil.disk_usage(probe).free
    except OSError:
        return "unknown free space"
    return f"{free / 2**20:.1f} MiB free on {probe}"


def disk_full_message(path: Path, what: str, kept: str) -> str:
    return (f"disk full while writing {what} {str(path)!r} ({free_space(path)}); {kept}. "
            "Free some space, or point the folder at a bigger disk, and run again")


@contextmanager
def disk_guard(path: Path, what: str, kept: str = "nothing half-written was kept"
               ) -> Iterator[None]:
    """Turn ENOSPC/EDQUOT raised inside the block into a StorageError naming `path`."""
    try:
        yield
    except OSError as exc:
        if not is_disk_full(exc):
            raise
        raise StorageError(disk_full_message(path, what, kept)) from exc
