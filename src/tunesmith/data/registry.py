"""Find datasets: entries of dataset_info.json (LLaMA-Factory's format), built-ins, paths."""

from __future__ import annotations

import glob
import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tunesmith.data.formats import CONVERTERS, FormatSpec
from tunesmith.errors import DataError

DATA_FILE_SUFFIXES = (".json", ".jsonl", ".csv", ".parquet")


@dataclass
class DatasetEntry:
    name: str
    files: list[Path]
    spec: FormatSpec
    ranking: bool = False
    num_samples: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


def builtin_data_dir() -> Path:
    return Path(str(resources.files("tunesmith") / "resources" / "data"))


def _read_info(folder: Path) -> dict[str, Any]:
    info = folder / "dataset_info.json"
    if not info.is_file():
        return {}
    try:
        data = json.loads(info.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataError(f"{info}:{exc.lineno}: malformed JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise DataError(f"{info}: expected an object mapping dataset names to entries")
    return data


def resolve_dataset(name: str, dataset_dir: str) -> DatasetEntry:
    """Resolve one name of `dataset:`; raise DataError naming what was looked at."""
    folder = Path(dataset_dir)
    for where in (folder, builtin_data_dir()):
        info = _read_info(where)
        if name in info:
            return _entry_from_info(name, info[name], where)
    files = sorted(Path(p) for p in glob.glob(name, recursive=True)) or (
        [Path(name)] if Path(name).exists() else [])
    if files:
        files = [f for p in files for f in (_data_files(p) if p.is_dir() else [p])]
        return DatasetEntry(name, files, FormatSpec(formatting="auto"))
    known = sorted(set(_read_info(folder)) | set(_read_info(builtin_data_dir())))
    import difflib

    near = difflib.get_close_matches(name, known, n=2)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise DataError(f"dataset: {name!r} is neither an entry of {folder / 'dataset_info.json'} "
                    f"(known: {', '.join(known) or 'none'}) nor an existing file or glob{hint}")


def _data_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in DATA_FILE_SUFFIXES)


def _entry_from_info(name: str, entry: Any, folder: Path) -> DatasetEntry:
    where = f"{folder / 'dataset_info.json'} entry {name!r}"
    if not isinstance(entry, dict):
        raise DataError(f"{where}: expected an object")
    if "file_name" not in entry:
        hub = next((k for k in ("hf_hub_url", "ms_hub_url", "script_url") if k in entry), None)
        msg = (f"loading from {hub} needs the network; download the data and set file_name"
               if hub else "has no file_name")
        raise DataError(f"{where}: {msg}")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in CONVERTERS:
        raise DataError(f"{where}: formatting {formatting!r} is not one of "
                        f"{', '.join(CONVERTERS)}")
    path = folder / entry["file_name"]
    files = _data_files(path) if path.is_dir() else [path]
    if not path.exists():
        raise DataError(f"{where}: file {str(path)!r} does not exist")
    spec = FormatSpec(formatting, dict(entry.get("columns") or {}), dict(entry.get("tags") or {}))
    return DatasetEntry(name, files, spec, bool(entry.get("ranking", False)),
                        int(entry.get("num_samples", 0) or 0),
                        {k: entry[k] for k in ("split", "subset") if k in entry})


def detect_format(row: dict[str, Any]) -> str:
    """Guess the format of a dataset given directly as a path, from its first row's keys."""
    if "messages" in row:
        return "openai"
    if "conversations" in row:
        return "sharegpt"
    if "instruction" in row or "output" in row:
        return "alpaca"
    raise DataError(f"cannot tell the format of a row with columns {sorted(row)}; add an entry "
                    "to dataset_info.json with formatting and columns")
