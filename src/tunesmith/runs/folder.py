"""What a run folder (output_dir) holds and how to read it.

    output_dir/
        metrics.jsonl          one JSON object per logged step (appended, flushed)
        run_summary.json       figures of the finished run
        config.resolved.yaml   every key with its value
        loss.png               the loss curve
        checkpoint-N/          complete checkpoints (trainer_state.json written last)
        .checkpoint-N.tmp/     a checkpoint being written (never picked)

Training writes these; the web UI, eval and export only read them, through this module.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
SUMMARY_FILE = "run_summary.json"
RESOLVED_CONFIG_FILE = "config.resolved.yaml"
LOSS_PLOT_FILE = "loss.png"
STATE_FILE = "trainer_state.json"  # written last into a checkpoint: its presence = complete
VALUE_HEAD_FILE = "value_head.safetensors"  # reward models (stage rm)
OUTPUT_ARTIFACTS = (METRICS_FILE, LOSS_PLOT_FILE, SUMMARY_FILE, RESOLVED_CONFIG_FILE, VALUE_HEAD_FILE)
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
