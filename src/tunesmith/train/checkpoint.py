"""Atomic checkpoints: complete or absent, never half-written.

    output_dir/.checkpoint-N.tmp/   <- everything written and fsynced here first
        trainable.safetensors  optimizer.pt  scheduler.pt  rng.pt  [adapter files]
        [deepspeed/ (ZeRO's own sharded state, written by every rank)]
        manifest.json           <- size + sha256 of every file above
        trainer_state.json      <- written last
    rename(.checkpoint-N.tmp -> checkpoint-N)   <- atomic on POSIX

Only folders named checkpoint-N holding trainer_state.json are ever picked for resuming,
and `resume_from_checkpoint: auto` passes over any whose files differ from the manifest.
A full disk removes the temporary folder and ends the run with a StorageError.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

from tunesmith.errors import StorageError, TrainingError
from tunesmith.runs.folder import (
    MANIFEST_FILE,
    STATE_FILE,
    checkpoint_path,
    checkpoint_problem,
    checkpoint_tmp,
    latest_good_checkpoint,
    list_checkpoints,
    manifest_text,
)
from tunesmith.runs.storage import disk_guard


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


@dataclass
class CheckpointState:
    """Everything a checkpoint holds, already gathered to plain CPU tensors (rank 0).

    Optimizer state is keyed by parameter names (torch.distributed.checkpoint's format),
    so a checkpoint written by any strategy or number of ranks loads under any other.
    """

    weights: dict[str, torch.Tensor]  # trainable parameters by name
    optimizer: dict[str, Any] | None  # None: save_only_model
    scheduler: dict[str, Any] | None
    scaler: dict[str, Any] | None
    rng: list[dict[str, Any]]  # one RNG state per rank
    meta: dict[str, Any]


def trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().contiguous().cpu() for n, p in model.named_parameters()
            if p.requires_grad}


def begin_checkpoint(output_dir: Path, step: int) -> Path:
    """Create the empty temporary folder of checkpoint-`step` (rank 0, before the others
    write engine state into it)."""
    tmp = checkpoint_tmp(output_dir, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def finish_checkpoint(output_dir: Path, step: int, state: CheckpointState,
                      extra_writer: Any = None) -> Path:
    """Write `state` into the temporary folder, fsync, rename to checkpoint-`step`."""
    tmp = checkpoint_tmp(output_dir, step)
    try:
        with disk_guard(tmp, f"checkpoint-{step}", "the unfinished checkpoint was removed "
                        "and the previous ones are intact"):
            tmp.mkdir(parents=True, exist_ok=True)
            _write_state_files(tmp, state, extra_writer)
            return _publish(output_dir, step, tmp)
    except StorageError:
        shutil.rmtree(tmp, ignore_errors=True)  # frees the space it took
        raise


def _write_state_files(tmp: Path, state: CheckpointState, extra_writer: Any) -> None:
    """Each file goes through `write_part` (one seam, so fault tests can crash anywhere)."""
    write_part(tmp / "trainable.safetensors",
               lambda p: save_file(state.weights, str(p)))
    if state.optimizer is not None:
        write_part(tmp / "optimizer.pt", lambda p: torch.save(state.optimizer, p))
        write_part(tmp / "scheduler.pt", lambda p: torch.save(state.scheduler, p))
        if state.scaler is not None:
            write_part(tmp / "scaler.pt", lambda p: torch.save(state.scaler, p))
    write_part(tmp / "rng.pt", lambda p: torch.save({"ranks": state.rng}, p))
    if extra_writer is not None:  # e.g. the PEFT adapter, so a checkpoint is usable alone
        write_part(tmp, extra_writer)
    write_part(tmp / MANIFEST_FILE, lambda p: _write_synced(p, manifest_text(tmp)))
    write_part(tmp / STATE_FILE, lambda p: _write_synced(p, json.dumps(state.meta, indent=2)))


def write_part(path: Path, writer: Any) -> None:
    """Write one file (or, for a folder, its extra files) of a checkpoint."""
    writer(path)


def _publish(output_dir: Path, step: int, tmp: Path) -> Path:
    final = checkpoint_path(output_dir, step)
    _fsync_tree(tmp)
    if final.exists():
        old = output_dir / f".checkpoint-{step}.old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        shutil.rmtree(old, ignore_errors=True)
    tmp.rename(final)
    _fsync_dir(output_dir)
    return final


def save_checkpoint(output_dir: Path, step: int, model: torch.nn.Module,
                    optimizer: torch.optim.Optimizer | None, scheduler: Any, scaler: Any,
                    meta: dict[str, Any], extra_writer: Any = None) -> Path:
    """One process: gather `model`'s trainable tensors and the optimizer state, and write
    checkpoint-`step` (the loop itself goes through its strategy, which also gathers)."""
    optim = None
    if optimizer is not None:
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

        optim = get_optimizer_state_dict(model, optimizer)
    state = CheckpointState(trainable_state(model), optim,
                            scheduler.state_dict() if optim is not None else None,
                            scaler.state_dict() if scaler is not None and optim else None,
                            [capture_rng()], meta)
    begin_checkpoint(output_dir, step)
    return finish_checkpoint(output_dir, step, state, extra_writer)


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


def read_checkpoint(path: Path) -> CheckpointState:
    """Read a complete checkpoint folder (tensors on the CPU)."""
    if not (path / STATE_FILE).is_file():
        raise TrainingError(f"resume_from_checkpoint: {str(path)!r} is not a complete tunesmith "
                            f"checkpoint (no {STATE_FILE}); give a checkpoint-N folder or auto")
    optimizer = scheduler = scaler = None
    if (path / "optimizer.pt").is_file():
        optimizer = torch.load(path / "optimizer.pt", weights_only=True)
        scheduler = torch.load(path / "scheduler.pt", weights_only=True)
        if (path / "scaler.pt").is_file():
            scaler = torch.load(path / "scaler.pt", weights_only=True)
    rng = torch.load(path / "rng.pt", weights_only=True)["ranks"]
    return CheckpointState(load_file(str(path / "trainable.safetensors")), optimizer,
                           scheduler, scaler, rng, json.loads((path / STATE_FILE).read_text()))


def pick_checkpoint(output_dir: Path, spec: str) -> Path | None:
    """The checkpoint to resume from: `spec` itself (refused when its files differ from its
    manifest), or for auto the newest intact one, saying which damaged ones were passed
    over. None: auto found nothing to resume."""
    if spec != "auto":
        path = Path(spec)
        problem = checkpoint_problem(path) if (path / STATE_FILE).is_file() else None
        if problem:
            raise TrainingError(f"resume_from_checkpoint: {str(path)!r} is damaged ({problem}); "
                                "give an earlier checkpoint-N, or auto to take the newest "
                                "intact one")
        return path
    path, passed = latest_good_checkpoint(output_dir)
    for line in passed:
        print(f"resume_from_checkpoint: {line}; passing over it")
    if passed:
        print(f"resume_from_checkpoint: using {path} instead" if path else
              "resume_from_checkpoint: no intact checkpoint left; starting from step 0")
    return path


def check_weights(path: Path, weights: dict[str, torch.Tensor], trainable: list[str]) -> None:
    missing = [n for n in trainable if n not in weights]
    if missing:
        raise TrainingError(f"{path}: checkpoint lacks {len(missing)} trainable tensor(s), e.g. "
                            f"{missing[0]}; it was written by a run with other settings")


def rotate_checkpoints(output_dir: Path, limit: int) -> None:
    if limit <= 0:
        return
    for old in list_checkpoints(output_dir)[:-limit]:
        shutil.rmtree(old, ignore_errors=True)
