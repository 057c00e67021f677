"""The property the reader fuzz checks: any file content yields rows or located errors."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tunesmith.data.encode import EncodeOptions
from tunesmith.data.formats import FormatSpec
from tunesmith.data.pipeline import EncodeJob, convert_row
from tunesmith.data.readers import read_rows
from tunesmith.errors import DataError

JOB = EncodeJob(FormatSpec("auto"), EncodeOptions(256), "", "", None, {})


def check_any_bytes(data: bytes, suffix: str) -> None:
    """Read `data` as a file with `suffix`; every row converts or is a located bad row.
    A whole-file DataError (a .json that does not parse) is an accepted answer too."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"fuzz{suffix}"
        path.write_bytes(data)
        try:
            for row, where in read_rows(path):
                assert where.startswith(str(path)), where
                bad: list[tuple[str, str]] = []
                conv = convert_row(row, where, JOB, bad)
                assert (conv is None) == bool(bad) and all(r for _, r in bad)
        except DataError as exc:
            assert str(path) in str(exc), exc
