"""Jobs: `tunesmith <command> <yaml>` child processes, recorded on disk.

    WORK/jobs/<id>/
      <command>.yaml   the config the job runs (the only way values reach the CLI)
      output.log       the child's stdout + stderr
      job.json         id, command, pid (+ its start time), status, return code

The child runs as `sys.executable -m tunesmith <command> <yaml>` (an argument list, never a
shell string) in its own session, so closing the browser or restarting the web UI does not
end it; a new web UI finds it again through job.json. Stop sends SIGTERM to the child's
process group: the trainer finishes its optimizer step, writes a checkpoint and exits.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from tunesmith.errors import TunesmithError
from tunesmith.webui.workspace import Workspace

COMMANDS = ("train", "eval", "export")
RUNNING, FINISHED, STOPPED, FAILED, ENDED = "running", "finished", "stopped", "failed", "ended"


@dataclass
class Job:
    id: str
    command: str
    folder: str
    config: str
    pid: int
    pid_start: str  # the process start time from /proc, so a reused pid is not mistaken
    started: float
    output_dir: str = ""  # where the job writes its results (run folder, export folder)
    returncode: int | None = None
    stop_requested: bool = False
    env: dict[str, str] = field(default_factory=dict)  # set for the job (hardware section)

    @property
    def log_path(self) -> Path:
        return Path(self.folder) / "output.log"


def _process_start(pid: int) -> str:
    """The start time of `pid` (field 22 of /proc/pid/stat); "" when not on Linux."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(pid: int, start: str) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    except OSError:  # no /proc: fall back to a signal-0 probe
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return True
    fields = stat.rsplit(")", 1)[1].split()
    return fields[0] != "Z" and (not start or fields[19] == start)


def command_line(command: str, yaml_path: Path | str) -> list[str]:
    """The argument list of a job: the interpreter, the module, the command, the YAML."""
    return [sys.executable, "-m", "tunesmith", command, str(yaml_path)]


def command_text(command: str, yaml_path: Path | str, env: dict[str, str] | None = None) -> str:
    """The same command as a person would type it (with the variables the job sets)."""
    prefix = [f"{k}={shlex.quote(v)}" for k, v in sorted((env or {}).items())]
    return " ".join(prefix + [shlex.join(["python", "-m", "tunesmith", command,
                                          str(yaml_path)])])


class JobRunner:
    """Launches, lists, watches and stops jobs of one workspace."""

    def __init__(self, ws: Workspace):
        self.ws = ws
        self._lock = threading.Lock()
        self._procs: dict[str, subprocess.Popen] = {}  # children of this process

    # ----- launch -----------------------------------------------------------------------
    def launch(self, command: str, config: dict, output_dir: str = "",
               env: dict[str, str] | None = None) -> Job:
        """Write `config` as YAML into a new job folder and start the command on it, with
        `env` added to this process's environment."""
        if command not in COMMANDS:
            raise TunesmithError(f"job: unknown command {command!r}; one of {COMMANDS}")
        job_id = time.strftime("%Y%m%d-%H%M%S") + f"-{command}-{secrets.token_hex(3)}"
        folder = self.ws.jobs_dir / job_id
        folder.mkdir(parents=True)
        cfg_path = folder / f"{command}.yaml"
        cfg_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
        argv = command_line(command, cfg_path)
        extra = dict(env or {})
        env = dict(os.environ, PYTHONUNBUFFERED="1", **extra)
        with open(folder / "output.log", "wb") as log:
            proc = subprocess.Popen(argv, cwd=self.ws.root, stdout=log,
                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    start_new_session=True, env=env)
        job = Job(job_id, command, str(folder), str(cfg_path), proc.pid,
                  _process_start(proc.pid), time.time(), output_dir, env=extra)
        self._save(job)
        self._procs[job_id] = proc
        threading.Thread(target=self._reap, args=(job, proc), daemon=True).start()
        return job

    def _reap(self, job: Job, proc: subprocess.Popen) -> None:
        returncode = proc.wait()
        with self._lock:
            current = self.get(job.id)
            current.returncode = returncode
            self._save(current)

    # ----- registry ---------------------------------------------------------------------
    def _save(self, job: Job) -> None:
        path = Path(job.folder) / "job.json"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(job), indent=1), encoding="utf-8")
        tmp.replace(path)

    def get(self, job_id: str) -> Job:
        path = self.ws.jobs_dir / job_id / "job.json"
        if not path.resolve().is_relative_to(self.ws.jobs_dir) or not path.is_file():
            raise TunesmithError(f"job: no job {job_id!r} in {self.ws.jobs_dir}")
        return Job(**json.loads(path.read_text(encoding="utf-8")))

    def list(self, command: str | None = None) -> list[Job]:
        """Jobs, newest first."""
        jobs = []
        for path in sorted(self.ws.jobs_dir.glob("*/job.json"), reverse=True):
            try:
                job = Job(**json.loads(path.read_text(encoding="utf-8")))
            except (OSError, ValueError, TypeError):
                continue  # a folder that is not a job of ours
            if command is None or job.command == command:
                jobs.append(job)
        return jobs

    def latest(self, command: str) -> Job | None:
        jobs = self.list(command)
        running = [j for j in jobs if self.status(j) == RUNNING]
        return (running or jobs or [None])[0]

    # ----- state ------------------------------------------------------------------------
    def status(self, job: Job) -> str:
        proc = self._procs.get(job.id)
        if proc is not None:  # our own child: its return code, without a race
            if proc.poll() is None:
                return RUNNING
            job.returncode = proc.returncode
        elif job.returncode is None and _alive(job.pid, job.pid_start):
            return RUNNING
        if job.returncode is None:  # ended while no web UI was watching it
            return STOPPED if job.stop_requested else ENDED
        if job.returncode == 0:
            return STOPPED if job.stop_requested else FINISHED
        if job.stop_requested and job.returncode == -signal.SIGTERM:
            return STOPPED  # stopped while still loading, before the loop could checkpoint
        return FAILED

    def stop(self, job_id: str) -> str:
        """Ask a running job to stop cleanly (SIGTERM to its process group)."""
        with self._lock:
            job = self.get(job_id)
            if self.status(job) != RUNNING:
                return f"job {job_id} is not running ({self.status(job)})"
            job.stop_requested = True
            self._save(job)
        try:
            os.killpg(job.pid, signal.SIGTERM)  # the child leads its own session and group
        except ProcessLookupError:
            return f"job {job_id} had already ended"
        return f"stop requested for job {job_id}; it ends after the current step"


def tail_text(path: Path, lines: int = 30, max_bytes: int = 65536) -> str:
    """The last lines of a log, with carriage-return progress bars reduced to their
    latest state."""
    if not path.is_file():
        return ""
    with open(path, "rb") as fh:
        fh.seek(max(0, path.stat().st_size - max_bytes))
        data = fh.read().decode("utf-8", errors="replace")
    shown = [line.rstrip("\r").rsplit("\r", 1)[-1] for line in data.split("\n")]
    return "\n".join(shown[-lines:])
