"""Read dataset files into rows, remembering where each row came from."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunesmith.errors import DataError

Row = tuple[dict[str, Any], str]  # (row, "file:line" or "file[index]")


def read_rows(path: Path) -> Iterator[Row]:
    """Yield (row, location) from a .json, .jsonl, .csv or .parquet file."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise DataError(f"dataset file {str(path)!r} does not exist")
    if suffix == ".jsonl":
        yield from _read_jsonl(path)
    elif suffix == ".json":
        yield from _read_json(path)
    elif suffix in (".csv", ".parquet", ".arrow"):
        yield from _read_tabular(path, suffix)
    else:
        raise DataError(f"dataset file {str(path)!r}: unsupported extension {suffix!r}; use "
                        ".json, .jsonl, .csv or .parquet")


def _read_jsonl(path: Path) -> Iterator[Row]:
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{lineno}: malformed JSON line ({exc.msg} at column "
                                f"{exc.colno}); fix or remove the line") from None
            yield row, f"{path}:{lineno}"


def _read_json(path: Path) -> Iterator[Row]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg} at column {exc.colno})"
                        ) from None
    if isinstance(data, dict):
        data = [data]
    if not isinstance(data, list):
        raise DataError(f"{path}: expected a JSON list of objects, got {type(data).__name__}")
    lines = _object_start_lines(text, len(data))
    for i, row in enumerate(data):
        where = f"{path}:{lines[i]}" if lines else f"{path}[{i}]"
        yield row, where


def _object_start_lines(text: str, count: int) -> list[int] | None:
    """Line number of each top-level list element in a JSON text (cheap bracket scan)."""
    lines: list[int] = []
    depth, line, in_str, esc = 0, 1, False, False
    for ch in text:
        if ch == "\n":
            line += 1
        if in_str:
            if esc:
                esc = False
            elif ch == "\\":
                esc = True
            elif ch == '"':
                in_str = False
            continue
        if ch == '"':
            in_str = True
        elif ch in "[{":
            depth += 1
            if depth == 2:
                lines.append(line)
        elif ch in "]}":
            depth -= 1
    return lines if len(lines) == count else None


def _read_tabular(path: Path, suffix: str) -> Iterator[Row]:
    try:
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {path} needs pyarrow: pip install 'tunesmith[data]'") from None
    table = pacsv.read_csv(path) if suffix == ".csv" else pq.read_table(path)
    offset = 2 if suffix == ".csv" else 0  # csv: header is line 1
    for i, row in enumerate(table.to_pylist()):
        yield row, f"{path}:{i + offset}" if suffix == ".csv" else f"{path}[{i}]"
