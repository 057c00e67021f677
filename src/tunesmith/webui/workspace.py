"""The web UI's working folder, and the path checks that keep every value inside it.

    WORK/
      data/      datasets (dataset_info.json, uploads)      -> dataset_dir
      saves/     training outputs (one folder per run)      -> output_dir
      exports/   merged / GGUF exports                       -> export_dir
      jobs/      one folder per launched job: the YAML it ran, its log, job.json

Every path a form value names (output_dir, dataset_dir, adapters, datasets given as files,
export_dir, ...) must resolve (symlinks followed) inside WORK; anything else is refused
before a YAML is written. Values reach the CLI only through that YAML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunesmith.errors import ConfigError

# Keys whose value is a path (besides any key ending in _dir, _path or _file).
PATH_KEYS = frozenset({"output_dir", "dataset_dir", "cache_dir", "adapter_name_or_path",
                       "resume_from_checkpoint", "dataset", "eval_dataset",
                       "model_name_or_path", "export_dir", "task_dir", "save_dir",
                       "tokenized_path", "deepspeed"})
# Values that name something other than a path.
_NOT_A_PATH = {"resume_from_checkpoint": {"auto", "true", "false"}}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")
_SAFE_NAME = re.compile(r"^[\w][\w.-]{0,120}$")


@dataclass(frozen=True)
class Workspace:
    """The folder the web UI works in; relative paths in its YAML files resolve here."""

    root: Path

    @classmethod
    def create(cls, root: str | Path) -> Workspace:
        ws = cls(Path(root).expanduser().resolve())
        for sub in (ws.data_dir, ws.saves_dir, ws.exports_dir, ws.jobs_dir):
            sub.mkdir(parents=True, exist_ok=True)
        return ws

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def saves_dir(self) -> Path:
        return self.root / "saves"

    @property
    def exports_dir(self) -> Path:
        return self.root / "exports"

    @property
    def jobs_dir(self) -> Path:
        return self.root / "jobs"

    def inside(self, value: str, key: str) -> Path:
        """Resolve `value` against the workspace; raise ConfigError when it leaves it."""
        if not value or "\x00" in value:
            raise ConfigError(f"{key}: {value!r} is not a usable path")
        path = (self.root / Path(value).expanduser()).resolve()
        if not path.is_relative_to(self.root):
            raise ConfigError(f"{key}: {value!r} is outside the working folder {self.root}; "
                              "use a path inside it (e.g. saves/my-run or data/file.json)")
        return path

    def relative(self, path: Path) -> str:
        """A path inside the workspace as written into YAML files (relative to the root)."""
        return str(path.resolve().relative_to(self.root))


def is_path_key(key: str) -> bool:
    return key in PATH_KEYS or key.endswith(("_dir", "_path", "_file"))


def check_paths(ws: Workspace, flat: dict[str, Any], known_names: set[str]) -> list[str]:
    """Problems with path-valued keys of a flat config (empty: all inside the workspace).

    `known_names` are values that are not paths: dataset names of dataset_info.json and
    built-in model aliases. A value shaped like a hub id (org/name) that does not exist as
    a local folder is taken as a hub id.
    """
    problems: list[str] = []
    for key, value in flat.items():
        if not is_path_key(key):
            continue
        for item in value if isinstance(value, list) else [value]:
            text = str(item)
            if not text or text in known_names or text in _NOT_A_PATH.get(key, ()):
                continue
            if key == "model_name_or_path" and _looks_like_hub_id(ws, text):
                continue
            try:
                ws.inside(text, key)
            except ConfigError as exc:
                problems.extend(exc.problems)
    return problems


def _looks_like_hub_id(ws: Workspace, text: str) -> bool:
    return bool(_HUB_ID.match(text)) and ".." not in text and not (ws.root / text).exists()


def safe_file_name(name: str) -> str:
    """The base name of an uploaded file, refused unless it is a plain file name."""
    base = Path(name).name
    if not _SAFE_NAME.match(base):
        raise ConfigError(f"upload: file name {name!r} is not allowed; use letters, digits, "
                          "'_', '-' and '.' only")
    return base
