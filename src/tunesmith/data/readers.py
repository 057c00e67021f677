"""Read dataset sources into rows, lazily, remembering where each row came from.

Rows stream one at a time (JSONL, CSV and Parquet never load whole), so data larger than
memory passes through. A row that cannot even be parsed (a malformed JSON line) comes out
as a `RowError` in place of the row, so the caller can report it with the others.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tunesmith.data.formats import RowError
from tunesmith.errors import DataError

Row = tuple[dict[str, Any] | RowError, str]  # (row or why it is unreadable, "file:line")
FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet", ".txt", ".arrow")
BOM = b"\xef\xbb\xbf"


def is_saved_dataset(path: Path) -> bool:
    """A folder written by `datasets.Dataset(Dict).save_to_disk`."""
    return path.is_dir() and ((path / "state.json").is_file()
                              or (path / "dataset_dict.json").is_file())


def read_rows(path: Path, split: str = "train") -> Iterator[Row]:
    """Yield (row, location) from a .json, .jsonl, .csv or .parquet file or a saved dataset."""
    if is_saved_dataset(path):
        yield from _read_saved(path, split)
        return
    suffix = path.suffix.lower()
    if not path.is_file():
        raise DataError(f"dataset file {str(path)!r} does not exist")
    if suffix == ".jsonl":
        yield from _read_jsonl(path)
    elif suffix == ".json":
        yield from _read_json(path)
    elif suffix == ".csv":
        yield from _read_csv(path)
    elif suffix == ".parquet":
        yield from _read_parquet(path)
    elif suffix == ".txt":
        yield from _read_text(path)
    elif suffix == ".arrow":
        yield from _read_arrow(path)
    else:
        raise DataError(f"dataset file {str(path)!r}: unsupported extension {suffix!r}; use "
                        ".json, .jsonl, .csv, .parquet, .txt, .arrow or a folder saved with "
                        "save_to_disk")


def _read_jsonl(path: Path) -> Iterator[Row]:
    """One object per line; a line that is not UTF-8 or not JSON is a RowError in place."""
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            where = f"{path}:{lineno}"
            if lineno == 1 and raw.startswith(BOM):
                raw = raw[len(BOM):]  # a BOM opening the file is the encoding's mark, not data
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                yield RowError(f"invalid UTF-8 (byte {exc.start} of the line); re-save the "
                               "file as UTF-8"), where
                continue
            if not line.strip():
                continue
            if line.startswith("\ufeff"):
                yield RowError("a byte-order mark inside the file (files concatenated?); "
                               "remove it"), where
                continue
            try:
                yield json.loads(line), where
            except json.JSONDecodeError as exc:
                yield RowError(f"malformed JSON line ({exc.msg} at column {exc.colno})"), where


def _read_json(path: Path) -> Iterator[Row]:
    """A JSON list of objects, parsed element by element (C speed) to learn each one's line."""
    # Undecodable bytes become lone surrogates, which the row checks report in place.
    text = path.read_bytes().removeprefix(BOM).decode("utf-8", errors="surrogateescape")
    decoder = json.JSONDecoder()
    pos = _skip_space(text, 0)
    if text.startswith("{", pos):
        yield _decode_at(decoder, text, pos, path)[0], f"{path}:{text.count(chr(10), 0, pos) + 1}"
        return
    if not text.startswith("[", pos):
        raise DataError(f"{path}: expected a JSON list of objects")
    pos, line, counted = _skip_space(text, pos + 1), 1, 0
    while not text.startswith("]", pos):
        line += text.count("\n", counted, pos)
        counted = pos
        row, end = _decode_at(decoder, text, pos, path)
        yield row, f"{path}:{line}"
        pos = _skip_space(text, end)
        if text.startswith(",", pos):
            pos = _skip_space(text, pos + 1)
        elif not text.startswith("]", pos):
            raise DataError(f"{path}:{text.count(chr(10), 0, pos) + 1}: malformed JSON "
                            "(expected ',' or ']' after a list element); fix the file")


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    return pos


def _decode_at(decoder: json.JSONDecoder, text: str, pos: int, path: Path) -> tuple[Any, int]:
    try:
        return decoder.raw_decode(text, pos)
    except json.JSONDecodeError as exc:
        raise DataError(f"{path}:{exc.lineno}: malformed JSON ({exc.msg} at column {exc.colno})"
                        "; fix the file (a .json file must parse as a whole)") from None


def _read_csv(path: Path) -> Iterator[Row]:
    """Every value is text (no type guessing turns an answer "4" into a number)."""
    with open(path, encoding="utf-8-sig", errors="surrogateescape", newline="") as fh:
        reader = csv.DictReader(fh)
        start = 2
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as exc:  # e.g. a field over the csv module's size limit
                yield RowError(f"unreadable CSV row ({exc})"), f"{path}:{start}"
                start = reader.line_num + 1
                continue
            yield _csv_row(row, start, reader.line_num), f"{path}:{start}"
            start = reader.line_num + 1


def _csv_row(row: dict[str, Any], start: int, end: int) -> dict[str, Any] | RowError:
    if None in row:
        return RowError(f"{len(row[None])} more value(s) than header columns")
    missing = [k for k, v in row.items() if v is None]
    if missing:
        spans = f"; an unclosed quote runs from here to line {end}" if end > start else ""
        return RowError(f"{len(missing)} value(s) missing (columns {missing}){spans}")
    return row


def _read_parquet(path: Path) -> Iterator[Row]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"reading {path} needs pyarrow: pip install 'tunesmith[data]'") from None
    i = 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=4096):
        for row in batch.to_pylist():
            yield row, f"{path}[row {i}]"
            i += 1


def _read_text(path: Path) -> Iterator[Row]:
    """One sample per line, in column `text` (LLaMA-Factory's .txt datasets, stage pt); a
    blank line is a row too (reported as empty text, as every bad row is)."""
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            yield {"text": line.rstrip("\r\n")}, f"{path}:{lineno}"


def _read_arrow(path: Path) -> Iterator[Row]:
    """An Arrow IPC file or stream (what `datasets` writes into its cache), batch by batch."""
    try:
        import pyarrow as pa
    except ImportError:
        raise DataError(f"reading {path} needs pyarrow: pip install 'tunesmith[data]'") from None
    try:
        reader: Any = pa.ipc.open_stream(pa.memory_map(str(path)))
    except pa.ArrowInvalid:
        try:
            reader = pa.ipc.open_file(pa.memory_map(str(path)))
        except pa.ArrowInvalid as exc:
            raise DataError(f"{path}: not an Arrow IPC file or stream ({exc})") from None
    if isinstance(reader, pa.ipc.RecordBatchFileReader):
        batches: Any = (reader.get_batch(i) for i in range(reader.num_record_batches))
    else:
        batches = reader
    i = 0
    for batch in batches:
        for row in batch.to_pylist():
            yield row, f"{path}[row {i}]"
            i += 1


def _read_saved(folder: Path, split: str) -> Iterator[Row]:
    datasets = _import_datasets(folder)
    ds = datasets.load_from_disk(str(folder))
    if isinstance(ds, datasets.DatasetDict):
        if split not in ds:
            raise DataError(f"{folder}: saved dataset has splits {sorted(ds)}, not {split!r}; "
                            "set split in dataset_info.json")
        ds = ds[split]
    for i, row in enumerate(ds):
        yield row, f"{folder}[{split} row {i}]"


def read_hub_rows(hub_id: str, subset: str | None, split: str, streaming: bool,
                  offline: bool) -> Iterator[Row]:
    """Rows of a Hugging Face hub dataset; a clear error when there is no network."""
    if offline:
        raise DataError(f"dataset {hub_id!r} is on the Hugging Face hub but the hub is offline "
                        "(HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE); download it and point "
                        "file_name (or dataset) at the local copy")
    datasets = _import_datasets(Path(hub_id))
    try:
        ds = datasets.load_dataset(hub_id, subset, split=split, streaming=streaming)
    except Exception as exc:  # network, auth and missing-split errors all land here
        raise DataError(f"dataset {hub_id!r}: could not load it from the hub ({exc}); check the "
                        "network and the id, or download it and use a local path") from None
    for i, row in enumerate(ds):
        yield row, f"{hub_id}[{split} row {i}]"


def _import_datasets(where: Path) -> Any:
    try:
        import datasets
    except ImportError:
        raise DataError(f"reading {where} needs the datasets package: pip install "
                        "'tunesmith[data]'") from None
    return datasets
