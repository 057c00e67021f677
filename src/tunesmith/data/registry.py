"""Find datasets: entries of dataset_info.json (LLaMA-Factory's format), built-ins, paths,
globs, folders saved with `save_to_disk`, and hub ids.

An entry of dataset_info.json (all keys optional but one source):

    "name": {"file_name": "a.json" | "folder" | "saved_dataset_folder",
             "hf_hub_url": "org/name", "subset": ..., "split": "train",
             "formatting": "alpaca" | "sharegpt" | "openai" | "text",
             "ranking": false, "num_samples": 1000,
             "columns": {"prompt": "instruction", ...}, "tags": {"role_tag": "from", ...}}
"""

from __future__ import annotations

import difflib
import glob
import json
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from tunesmith.data.formats import CONVERTERS, FormatSpec
from tunesmith.data.readers import FILE_SUFFIXES, is_saved_dataset
from tunesmith.errors import DataError

ENTRY_KEYS = {"file_name", "hf_hub_url", "ms_hub_url", "om_hub_url", "script_url", "cloud_file_name",
              "formatting", "ranking", "subset", "split", "folder", "num_samples", "columns",
              "tags"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass
class DatasetEntry:
    name: str
    files: list[Path]
    spec: FormatSpec
    num_samples: int = 0  # LLaMA-Factory's num_samples: sub- or over-sample to this many
    split: str = "train"
    hub_id: str = ""  # rows come from the hub instead of files
    subset: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ranking(self) -> bool:
        return self.spec.ranking


def builtin_data_dir() -> Path:
    return Path(str(resources.files("tunesmith") / "resources" / "data"))


def read_dataset_info(folder: Path) -> dict[str, Any]:
    info = folder / "dataset_info.json"
    if not info.is_file() or is_saved_dataset(folder):
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
        info = read_dataset_info(where)
        if name in info:
            return _entry_from_info(name, info[name], where)
    path = Path(name).expanduser()
    if is_saved_dataset(path):
        return DatasetEntry(name, [path], FormatSpec(formatting="auto"))
    files = sorted(Path(p) for p in glob.glob(str(path), recursive=True))
    files = [f for p in files for f in (_data_files(p) if p.is_dir() else [p])]
    if files:
        return DatasetEntry(name, files, FormatSpec(formatting="auto"))
    if _HUB_ID.match(name) and not path.exists():
        return DatasetEntry(name, [], FormatSpec(formatting="auto"), hub_id=name)
    known = sorted(set(read_dataset_info(folder)) | set(read_dataset_info(builtin_data_dir())))
    near = difflib.get_close_matches(name, known, n=2)
    hint = f"; did you mean {', '.join(near)}?" if near else ""
    raise DataError(f"dataset: {name!r} is neither an entry of {folder / 'dataset_info.json'} "
                    f"(known: {', '.join(known) or 'none'}) nor an existing file or glob{hint}")


def _data_files(folder: Path) -> list[Path]:
    if is_saved_dataset(folder):
        return [folder]
    return sorted(p for p in folder.rglob("*") if p.suffix.lower() in FILE_SUFFIXES
                  and p.name != "dataset_info.json")


def _entry_from_info(name: str, entry: Any, folder: Path) -> DatasetEntry:
    where = f"{folder / 'dataset_info.json'} entry {name!r}"
    if not isinstance(entry, dict):
        raise DataError(f"{where}: expected an object")
    unknown = sorted(set(entry) - ENTRY_KEYS)
    if unknown:
        raise DataError(f"{where}: unknown key(s) {', '.join(unknown)}; known keys are "
                        f"{', '.join(sorted(ENTRY_KEYS))}")
    formatting = entry.get("formatting", "alpaca")
    if formatting not in CONVERTERS:
        raise DataError(f"{where}: formatting {formatting!r} is not one of "
                        f"{', '.join(CONVERTERS)}")
    for key in ("columns", "tags"):
        if not isinstance(entry.get(key) or {}, dict):
            raise DataError(f"{where}: {key} must be an object of name -> column/tag")
    spec = FormatSpec(formatting, dict(entry.get("columns") or {}), dict(entry.get("tags") or {}),
                      bool(entry.get("ranking", False)))
    common = {"num_samples": int(entry.get("num_samples") or 0),
              "split": str(entry.get("split") or "train"), "subset": entry.get("subset")}
    if "file_name" in entry:
        path = folder / entry["file_name"]
        if not path.exists():
            raise DataError(f"{where}: file {str(path)!r} does not exist")
        files = _data_files(path) if path.is_dir() else [path]
        if not files:
            raise DataError(f"{where}: folder {str(path)!r} holds no {'/'.join(FILE_SUFFIXES)} "
                            "files")
        return DatasetEntry(name, files, spec, **common)
    if "hf_hub_url" in entry:
        return DatasetEntry(name, [], spec, hub_id=str(entry["hf_hub_url"]), **common)
    other = next((k for k in ("ms_hub_url", "om_hub_url", "script_url", "cloud_file_name")
                  if k in entry), None)
    msg = (f"{other} sources are not supported; download the data and set file_name"
           if other else "has no file_name or hf_hub_url")
    raise DataError(f"{where}: {msg}")


def detect_format(row: dict[str, Any]) -> str:
    """Guess the format of a dataset given directly as a path, from its first row's keys."""
    if "messages" in row:
        return "openai"
    if "conversations" in row:
        return "sharegpt"
    if "instruction" in row or "output" in row:
        return "alpaca"
    if "text" in row:
        return "text"
    raise DataError(f"cannot tell the format of a row with columns {sorted(row)}; add an entry "
                    "to dataset_info.json with formatting and columns")
