"""Atomic checkpoints: complete or absent, never half-written.

    output_dir/.checkpoint-N.tmp/   <- everything written and fsynced here first
        trainable.safetensors  optimizer.pt  scheduler.pt  rng.pt  [adapter files]
        trainer_state.json      <- written last
    rename(.checkpoint-N.tmp -> checkpoint-N)   <- atomic on POSIX

Only folders named checkpoint-N holding trainer_state.json are ever picked for resuming.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tunesmith.errors import TrainingError

STATE_FILE = "trainer_state.json"
_CKPT = re.compile(r"^checkpoint-(\d+)$")


def capture_rng() -> dict[str, Any]:
    np_state = np.random.get_state()
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": (np_state[0], np_state[1].tolist(), *np_state[2:]),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    kind, keys, *rest = state["numpy"]
    np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), *rest))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().cpu() for n, p in model.named_parameters()
            if p.requires_grad}


def save_checkpoint(output_dir: Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None, scheduler: Any, scaler: Any,
                    state: dict[str, Any], extra_writer: Any = None) -> Path:
    """Write checkpoint-`step` atomically and return its path."""
    final = output_dir / f"checkpoint-{step}"
    tmp = output_dir / f".checkpoint-{step}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    save_file(trainable_state(model), str(tmp / "trainable.safetensors"))
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        if scaler is not None:
            torch.save(scaler.state_dict(), tmp / "scaler.pt")
    torch.save(capture_rng(), tmp / "rng.pt")
    if extra_writer is not None:
        extra_writer(tmp)  # e.g. the PEFT adapter, so a checkpoint is usable on its own
    _write_synced(tmp / STATE_FILE, json.dumps(state, indent=2))
    _fsync_tree(tmp)
    if final.exists():
        old = output_dir / f".checkpoint-{step}.old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(final)
    _fsync_dir(output_dir)
    return final


def _write_synced(path: Path, text: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())


def _fsync_tree(folder: Path) -> None:
    for p in folder.rglob("*"):
        if p.is_file():
            with open(p, "rb") as fh:
                os.fsync(fh.fileno())
    _fsync_dir(folder)


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


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


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, scaler: Any) -> dict[str, Any]:
    if not (path / STATE_FILE).is_file():
        raise TrainingError(f"resume_from_checkpoint: {str(path)!r} is not a complete tunesmith "
                            f"checkpoint (no {STATE_FILE}); give a checkpoint-N folder or auto")
    weights = load_file(str(path / "trainable.safetensors"))
    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in weights]
    if missing:
        raise TrainingError(f"{path}: checkpoint lacks {len(missing)} trainable tensor(s), e.g. "
                            f"{missing[0]}; it was written by a run with other settings")
    with torch.no_grad():
        for name, tensor in weights.items():
            params[name].copy_(tensor)
    if (path / "optimizer.pt").is_file():
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
        if scaler is not None and (path / "scaler.pt").is_file():
            scaler.load_state_dict(torch.load(path / "scaler.pt", weights_only=True))
    restore_rng(torch.load(path / "rng.pt", weights_only=True))
    return json.loads((path / STATE_FILE).read_text())


def rotate_checkpoints(output_dir: Path, limit: int) -> None:
    if limit <= 0:
        return
    for old in list_checkpoints(output_dir)[:-limit]:
        shutil.rmtree(old, ignore_errors=True)
