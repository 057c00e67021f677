"""Write an export into a hidden sibling folder and rename it into place on success.

    export_dir/ (absent, empty, or replaced only with overwrite_output_dir)
    .export_dir.partial-<pid>/  <- everything is written here
        success: export_dir -> .export_dir.old-<pid>; partial -> export_dir; old removed
        failure: the partial folder is removed; a killed process leaves only a hidden
                 `.partial-` folder, never a half export under the name the user asked for.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tunesmith.errors import ConfigError
from tunesmith.runs.storage import disk_guard


def check_export_dir(export_dir: str, overwrite: bool) -> Path:
    """The export folder, refusing to replace a non-empty one without `overwrite`.

    Raises:
        ConfigError: export_dir is unset, is a file, or is non-empty without overwrite.
    """
    if not export_dir:
        raise ConfigError("export_dir: not set; give the folder to write the export to, e.g. "
                          "export_dir: saves/my-model-merged")
    out = Path(export_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"export_dir: {str(out)!r} is a file; give a folder")
    if out.is_dir() and any(out.iterdir()) and not overwrite:
        raise ConfigError(f"export_dir: {str(out)!r} exists and is not empty; set "
                          "overwrite_output_dir: true to replace it, or choose another folder")
    return out


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove_stale(out: Path) -> None:
    """Partial folders left by killed exports to the same place."""
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        pid = stale.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)


@contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """Yield a temporary folder that becomes `out` only if the block completes."""
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        with disk_guard(out, "the export", "the partial export was removed and "
                        f"{out} is as it was"):
            yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    if out.exists():
        out.rename(old)  # the previous export stays whole until the new one is in place
    tmp.rename(out)
    shutil.rmtree(old, ignore_errors=True)
