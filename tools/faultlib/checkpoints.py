"""Crashes (real SIGKILL in a forked writer) at every file of a checkpoint and between
files, checkpoint corruption (truncation, bit flips) and disk-full errors."""

from __future__ import annotations

import errno
import json
import os
import signal
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from tunesmith.errors import StorageError, TrainingError
from tunesmith.runs import folder as runs
from tunesmith.train import checkpoint as ckpt


class _Model:
    """A small model + optimizer whose weights change at every save."""

    def __init__(self, seed: int = 0):
        torch.manual_seed(seed)
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 4))
        self.opt = torch.optim.AdamW(self.net.parameters(), lr=1e-2)
        self.sched = torch.optim.lr_scheduler.LambdaLR(self.opt, lambda s: 1.0)

    def step(self) -> None:
        loss = self.net(torch.randn(8, 16)).square().mean()
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in ckpt.trainable_state(self.net).items()}

    def save(self, out: Path, step: int) -> Path:
        return ckpt.save_checkpoint(out, step, self.net, self.opt, self.sched, None,
                                    {"step": step}, extra_writer=_adapter_writer(self))


def _adapter_writer(model: _Model):
    def write(folder: Path) -> None:  # stands in for the PEFT adapter files
        save_file(model.weights(), str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text(json.dumps({"r": 4}))
    return write


def crash_points(out: Path) -> list[tuple[str, int]]:
    """Every place a writer can die: before, inside and after each file, before the
    rename and after it."""
    names: list[str] = []
    real = ckpt.write_part
    ckpt.write_part = lambda path, writer: (names.append(path.name), real(path, writer))
    try:
        _Model().save(out, 1)
    finally:
        ckpt.write_part = real
    n = len(names)
    return ([(k, i) for i in range(n) for k in ("before", "inside", "after")]
            + [("publish", 0), ("published", 0)])


def _arm(point: tuple[str, int]) -> None:
    """In the forked child: SIGKILL this process at `point`."""
    kind, target = point
    seen = [0]
    real_write, real_publish = ckpt.write_part, ckpt._publish

    def die() -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    def write(path: Path, writer: Any) -> None:
        i = seen[0]
        seen[0] += 1
        if i == target and kind == "before":
            die()
        real_write(path, writer)
        if i == target and kind == "inside":
            victim = path if path.is_file() else max(path.iterdir(), key=lambda p: p.stat().st_mtime_ns)
            with open(victim, "r+b") as fh:  # the file is cut half way, as by a crash
                fh.truncate(max(victim.stat().st_size // 2, 0))
            die()
        if i == target and kind == "after":
            die()

    def publish(output_dir: Path, step: int, tmp: Path) -> Path:
        if kind == "publish":
            die()
        path = real_publish(output_dir, step, tmp)
        if kind == "published":
            die()
        return path

    ckpt.write_part, ckpt._publish = write, publish


def crash_in_checkpoint_writes(work: Path, count: int = 50) -> dict[str, Any]:
    """`count` SIGKILLs spread over every crash point; after each, resuming must pick the
    newest complete checkpoint and read back exactly the weights it holds."""
    out = work / "crashes"
    points = crash_points(work / "probe")
    model = _Model(1)
    model.save(out, 1)
    saved = {1: model.weights()}
    good, failures = 0, []
    for i in range(count):
        point, step = points[i % len(points)], i + 2
        model.step()
        pid = os.fork()
        if pid == 0:  # the writer: dies at `point`
            try:
                _arm(point)
                model.save(out, step)
            finally:
                os._exit(0)
        _, status = os.waitpid(pid, 0)
        killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
        if point[0] == "published":
            saved[step] = model.weights()
        expect = max(saved)
        picked = ckpt.pick_checkpoint(out, "auto")
        state = ckpt.read_checkpoint(picked) if picked else None
        same = state is not None and all(torch.equal(state.weights[k], v)
                                         for k, v in saved[expect].items())
        if killed and picked == runs.checkpoint_path(out, expect) and same:
            good += 1
        else:
            failures.append(f"{point}: picked {picked}, expected checkpoint-{expect}")
    return {"fault": "crash inside checkpoint writing", "count": count, "ok": good,
            "how": f"SIGKILL of a forked writer at {len(points)} points (before, inside and "
                   "after each file; before and after the rename), cycled",
            "notes": failures[:5]}


def corrupt_checkpoints(work: Path, count: int = 10) -> dict[str, Any]:
    """Truncate or flip one bit of a file of the newest checkpoint: auto must pass over it,
    say so, and pick the previous one; naming the damaged one explicitly is an error."""
    good, notes = 0, []
    for i in range(count):
        out = work / f"corrupt-{i}"
        model = _Model(i)
        model.save(out, 10)
        model.step()
        newest = model.save(out, 20)
        files = sorted(p for p in newest.iterdir() if p.name not in (
            runs.MANIFEST_FILE, runs.STATE_FILE))
        victim = files[i % len(files)]
        data = bytearray(victim.read_bytes())
        how = "truncated" if i % 2 == 0 else "bit-flipped"
        if how == "truncated":
            victim.write_bytes(bytes(data[: len(data) // 2]))
        else:
            data[len(data) // 2] ^= 0x10
            victim.write_bytes(bytes(data))
        path, passed = runs.latest_good_checkpoint(out)
        try:
            ckpt.pick_checkpoint(out, str(newest))
            refused = False
        except TrainingError as exc:
            refused = victim.name in str(exc)
        auto = ckpt.pick_checkpoint(out, "auto")  # prints what it passed over
        if (path == auto == out / "checkpoint-10" and passed and victim.name in passed[0]
                and refused):
            good += 1
        else:
            notes.append(f"{how} {victim.name}: picked {path}, passed {passed}")
    return {"fault": "checkpoint file truncated or bit-flipped", "count": count, "ok": good,
            "how": "one file of the newest checkpoint cut in half or one bit flipped, "
                   "alternately, over every file kind", "notes": notes[:5]}


def _full_at(real: Any, k: int) -> Any:
    """`write_part` that raises ENOSPC at its k-th call (0-based)."""
    seen = [0]

    def full(path: Path, writer: Any) -> None:
        seen[0] += 1
        if seen[0] - 1 == k:
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        real(path, writer)
    return full


def disk_full_checkpoint(work: Path, count: int = 8) -> dict[str, Any]:
    """ENOSPC inside the k-th file of a checkpoint: a StorageError naming the path and free
    space; the partial folder is gone; the previous checkpoint is the one picked."""
    good, notes = 0, []
    parts = (len(crash_points(work / "probe-enospc")) - 2) // 3
    for i in range(count):
        out = work / f"enospc-{i}"
        model = _Model(i)
        model.save(out, 10)
        real = ckpt.write_part
        ckpt.write_part = _full_at(real, i % parts)
        try:
            model.save(out, 20)
            message = ""
        except StorageError as exc:
            message = str(exc)
        finally:
            ckpt.write_part = real
        clean = not runs.checkpoint_tmp(out, 20).exists() and not (out / "checkpoint-20").exists()
        if ("disk full" in message and "checkpoint-20" in message and "free" in message and clean
                and ckpt.pick_checkpoint(out, "auto") == out / "checkpoint-10"):
            good += 1
        else:
            notes.append(f"file {i}: {message!r}, clean={clean}")
    return {"fault": "disk full while writing a checkpoint", "count": count, "ok": good,
            "how": f"ENOSPC raised in file k of checkpoint-20 (k cycles over its {parts} files)",
            "notes": notes[:5]}
