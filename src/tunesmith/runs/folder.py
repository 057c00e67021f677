"""What a run folder (output_dir) holds and how to read it.

    output_dir/
        metrics.jsonl          one JSON object per logged step (appended, flushed)
        run_summary.json       figures of the finished run
        config.resolved.yaml   every key with its value
        loss.png               the loss curve
        checkpoint-N/          complete checkpoints: manifest.json (size + sha256 of
                               every file) then trainer_state.json, written last
        .checkpoint-N.tmp/     a checkpoint being written (never picked)
        .tunesmith.lock        pid + start time of the run writing here (one at a time)

Training writes these; the web UI, eval and export only read them, through this module.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tunesmith.errors import StorageError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "run_summary.json"
RESOLVED_CONFIG_FILE = "config.resolved.yaml"
LOSS_PLOT_FILE = "loss.png"
STATE_FILE = "trainer_state.json"  # written last into a checkpoint: its presence = complete
MANIFEST_FILE = "manifest.json"  # size and sha256 of every other file, written just before
LOCK_FILE = ".tunesmith.lock"
VALUE_HEAD_FILE = "value_head.safetensors"  # reward models (stage rm)
OUTPUT_ARTIFACTS = (METRICS_FILE, LOSS_PLOT_FILE, SUMMARY_FILE, RESOLVED_CONFIG_FILE,
                    VALUE_HEAD_FILE)
_CKPT = re.compile(r"^checkpoint-(\d+)$")


def checkpoint_path(output_dir: Path, step: int) -> Path:
    return output_dir / f"checkpoint-{step}"


def checkpoint_tmp(output_dir: Path, step: int) -> Path:
    return output_dir / f".checkpoint-{step}.tmp"


def list_checkpoints(output_dir: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not output_dir.is_dir():
        return []
    found = []
    for p in output_dir.iterdir():
        m = _CKPT.match(p.name)
        if m and (p / STATE_FILE).is_file():
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: Path) -> Path | None:
    ckpts = list_checkpoints(output_dir)
    return ckpts[-1] if ckpts else None


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl (a run folder or the file itself); a line being
    written right now ends the list."""
    if path.is_dir():
        path = path / METRICS_FILE
    if not path.is_file():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return out


def read_summary(output_dir: Path) -> dict[str, Any] | None:
    """run_summary.json of a finished run, or None."""
    path = output_dir / SUMMARY_FILE
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError:
        return None


# ----- checkpoint manifest ---------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _manifest_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file()
                  and p.relative_to(folder).as_posix() not in (MANIFEST_FILE, STATE_FILE))


def manifest_text(folder: Path) -> str:
    """manifest.json for the files now in `folder` (all but the manifest and state file)."""
    files = {p.relative_to(folder).as_posix(): {"size": p.stat().st_size, "sha256": _sha256(p)}
             for p in _manifest_files(folder)}
    return json.dumps({"format": 1, "files": files}, indent=1)


def checkpoint_problem(folder: Path) -> str | None:
    """Why checkpoint `folder` cannot be trusted (missing, truncated or altered file, bad
    state file), or None when every file matches its manifest."""
    try:
        json.loads((folder / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return f"{STATE_FILE} unreadable ({exc.__class__.__name__})"
    if not (folder / MANIFEST_FILE).is_file():
        return None  # written before manifests existed; `damaged_checkpoints` warns
    try:
        files = json.loads((folder / MANIFEST_FILE).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError) as exc:
        return f"{MANIFEST_FILE} unreadable ({exc.__class__.__name__})"
    for name, want in files.items():
        path = folder / name
        if not path.is_file():
            return f"{name} is missing"
        size = path.stat().st_size
        if size != want["size"]:
            return f"{name} is {size} bytes, the manifest says {want['size']} (truncated?)"
        if _sha256(path) != want["sha256"]:
            return f"{name} does not match its sha256 in {MANIFEST_FILE} (corrupted)"
    return None


def latest_good_checkpoint(output_dir: Path) -> tuple[Path | None, list[str]]:
    """The newest checkpoint whose files match their manifest, and one line per newer
    checkpoint passed over ("checkpoint-30: optimizer.pt ... (truncated?)")."""
    passed: list[str] = []
    for path in reversed(list_checkpoints(output_dir)):
        problem = checkpoint_problem(path)
        if problem is None:
            if not (path / MANIFEST_FILE).is_file():
                log.warning("%s has no %s (written by an older tunesmith); its files "
                            "cannot be verified", path, MANIFEST_FILE)
            return path, passed
        passed.append(f"{path.name}: {problem}")
    return None, passed


# ----- one run per output_dir --------------------------------------------------------------
def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (tells a live process from a reused pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, started: str | None) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    now = _start_time(pid)
    return started is None or now is None or now == started


@dataclass
class RunLock:
    """`output_dir/.tunesmith.lock`, created exclusively; released by `release`."""

    path: Path
    held: bool = False

    def acquire(self, what: str) -> RunLock:
        if self.path.parent.exists() and not self.path.parent.is_dir():
            raise StorageError(f"output_dir: {str(self.path.parent)!r} is a file; give a folder")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = {"pid": os.getpid(), "started": _start_time(os.getpid()),
              "host": socket.gethostname(), "what": what}
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._clear_stale()
                continue
            with os.fdopen(fd, "w") as fh:
                fh.write(json.dumps(me))
            self.held = True
            return self
        raise StorageError(f"{self.path}: could not take the lock; remove it if no run uses "
                           f"{self.path.parent}")

    def _clear_stale(self) -> None:
        try:
            holder = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            holder = {}
        pid, host = holder.get("pid"), holder.get("host")
        if isinstance(pid, int) and host == socket.gethostname() and not _alive(
                pid, holder.get("started")):
            log.warning("%s: recovered a stale lock of pid %d (no longer running)",
                        self.path, pid)
            print(f"output_dir: recovered the stale lock of pid {pid}, which is no longer "
                  "running")
            self.path.unlink(missing_ok=True)
            return
        if not holder:
            raise StorageError(f"{self.path}: the lock file of {self.path.parent} is empty "
                               "or unreadable (a run is starting, or one died while taking "
                               "it); if no run uses the folder, delete the file")
        if host == socket.gethostname():
            raise StorageError(
                f"output_dir: {str(self.path.parent)!r} is in use by another run (pid "
                f"{pid}, {holder.get('what', '?')}; lock {self.path}); wait for it to "
                "finish, stop it, or choose another output_dir")
        raise StorageError(
            f"output_dir: {str(self.path.parent)!r} is locked by pid {pid} on host {host!r} "
            f"({self.path}); if that run is gone, delete the lock file and run again")

    def release(self) -> None:
        if self.held:
            self.path.unlink(missing_ok=True)
            self.held = False


def lock_run_folder(output_dir: Path, what: str = "train") -> RunLock:
    """Take output_dir for this process, or raise StorageError naming the holder."""
    return RunLock(output_dir / LOCK_FILE).acquire(what)
