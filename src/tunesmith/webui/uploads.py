"""Uploaded data files: checked, then copied into WORK/data whole or not at all.

Refused: names that are not plain file names (traversal, separators, hidden files), a
source that is a symlink (it would copy whatever it points at), a target that is a
symlink or a folder, files over the size limit, and files whose suffix or content is not
a data file (UTF-8 text for .json/.jsonl/.csv, the Parquet magic for .parquet).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tunesmith.data.readers import FILE_SUFFIXES
from tunesmith.errors import ConfigError
from tunesmith.runs.storage import disk_guard
from tunesmith.webui.workspace import Workspace, safe_file_name

MAX_UPLOAD_BYTES = 2 * 2**30  # 2 GiB


def store_upload(ws: Workspace, file_path: str, max_bytes: int = MAX_UPLOAD_BYTES) -> str:
    """Copy the uploaded `file_path` into ws.data_dir; returns the stored name."""
    source = Path(file_path)
    name = safe_file_name(source.name)
    suffix = Path(name).suffix.lower()
    if suffix not in FILE_SUFFIXES:
        raise ConfigError(f"upload: {name!r} is not a data file; use {', '.join(FILE_SUFFIXES)}")
    if source.is_symlink() or not source.is_file():
        raise ConfigError(f"upload: {name!r} is not a regular file (a link or a folder)")
    size = source.stat().st_size
    if size > max_bytes:
        raise ConfigError(f"upload: {name!r} is {size} bytes, over the upload limit of "
                          f"{max_bytes} bytes; copy large datasets into {ws.data_dir} directly")
    _check_content(source, name, suffix)
    target = ws.data_dir / name
    if target.is_symlink() or target.is_dir() or ws.inside(f"data/{name}", "upload").parent \
            != ws.data_dir:
        raise ConfigError(f"upload: {name!r} would not land as a plain file in the data folder")
    tmp = ws.data_dir / f".{name}.upload-{os.getpid()}"
    try:
        with disk_guard(target, "the uploaded file"):
            with open(source, "rb") as src, open(tmp, "xb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return name


def _check_content(source: Path, name: str, suffix: str) -> None:
    with open(source, "rb") as fh:
        head = fh.read(1 << 16)
    if suffix == ".parquet":
        if not head.startswith(b"PAR1"):
            raise ConfigError(f"upload: {name!r} is not a Parquet file (no PAR1 header)")
        return
    cut = len(head)
    while cut > len(head) - 4 and cut > 0:  # a multi-byte character may straddle the cut
        try:
            head[:cut].decode("utf-8")
            break
        except UnicodeDecodeError:
            cut -= 1
    if b"\x00" in head or cut <= len(head) - 4:
        raise ConfigError(f"upload: {name!r} is not UTF-8 text, as a {suffix} file must be")
