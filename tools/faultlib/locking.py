"""Two runs into one output_dir: the second is refused while the first holds the folder
(and the first's files stay byte for byte as they were); a lock left by a killed run is
recovered."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from faultlib.kills import _env, run_cli, write_train_config

HOLDER = ("import sys, time, pathlib; sys.path.insert(0, sys.argv[2]);"
          "from tunesmith.runs.folder import lock_run_folder;"
          "lock_run_folder(pathlib.Path(sys.argv[1])); print('held', flush=True); time.sleep(600)")


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _holder(out: Path, cache: Path) -> subprocess.Popen:
    src = str(Path(__file__).parents[2] / "src")
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(out), src], env=_env(cache),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    return proc


def lock_campaign(work: Path, model: Path, data: Path, count: int = 10) -> dict[str, Any]:
    """`count` second runs (fresh, overwrite_output_dir, resume) into a folder held by a live
    process: all refused, nothing changed; then the holder is SIGKILLed and one real run
    must recover its stale lock and finish."""
    work.mkdir(parents=True, exist_ok=True)
    out, cache = work / "run", work / "cache"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 1, "loss": 1.0}\n')
    (out / "checkpoint-4").mkdir()
    (out / "checkpoint-4" / "trainer_state.json").write_text('{"step": 4}')
    cfg = write_train_config(work, model, data, out)
    holder = _holder(out, cache)
    before = _snapshot(out)
    variants = [[], ["overwrite_output_dir=true"], ["resume_from_checkpoint=auto"]]
    good, notes = 0, []
    try:
        for i in range(count):
            rc, log = run_cli(["train", str(cfg), *variants[i % 3]], cache)
            untouched = _snapshot(out) == before
            if rc == 1 and "in use by another run" in log and untouched:
                good += 1
            else:
                notes.append(f"{variants[i % 3]}: rc={rc} untouched={untouched} {log[-300:]}")
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    time.sleep(0.1)
    rc, log = run_cli(["train", str(cfg), "overwrite_output_dir=true"], cache)
    recovered = rc == 0 and "recovered the stale lock" in log and not (
        out / ".tunesmith.lock").exists()
    good += recovered
    if not recovered:
        notes.append(f"stale lock: rc={rc} {log[-400:]}")
    return {"fault": "two runs into one output_dir", "count": count + 1, "ok": good,
            "how": f"{count} second runs (plain, overwrite_output_dir, resume) while a live "
                   "process holds the folder; then the holder is SIGKILLed and a real run "
                   "must recover the stale lock and finish", "notes": notes[:5]}
