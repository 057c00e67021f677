"""Kill a run with SIGKILL after a checkpoint, resume it in a fresh process, and get the
very same weights as an uninterrupted run; a crash while writing never leaves a half
checkpoint that could be picked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from tunesmith.runs import folder as runs_folder
from tunesmith.train import checkpoint as ckpt

SRC = str(Path(__file__).parents[1] / "src")


def _config(tmp_path: Path, model_dir: Path, data: Path, out: Path, **extra) -> Path:
    cfg = {"model_name_or_path": str(model_dir), "dataset": str(data), "output_dir": str(out),
           "max_steps": 300, "save_steps": 20, "logging_steps": 10, "learning_rate": 2e-3,
           "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
           "lora_rank": 4, "lora_dropout": 0.1, "seed": 7, "warmup_steps": 5, **extra}
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _train(cfg: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "tunesmith", "train", str(cfg), *extra],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_sigkill_then_resume_equals_uninterrupted(tmp_path, tiny_llama_dir, alpaca_file):
    full_out, killed_out = tmp_path / "full", tmp_path / "killed"
    uninterrupted = _train(_config(tmp_path, tiny_llama_dir, alpaca_file, full_out))
    victim = _train(_config(tmp_path, tiny_llama_dir, alpaca_file, killed_out))
    deadline = time.time() + 120
    while not runs_folder.list_checkpoints(killed_out):
        assert victim.poll() is None, victim.stdout.read()
        assert time.time() < deadline, "no checkpoint appeared"
        time.sleep(0.01)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert victim.returncode == -signal.SIGKILL
    assert not (killed_out / "adapter_model.safetensors").exists()  # it did not finish
    resumed_from = runs_folder.latest_checkpoint(killed_out)
    assert resumed_from is not None and int(resumed_from.name.split("-")[1]) < 300

    resumed = _train(_config(tmp_path, tiny_llama_dir, alpaca_file, killed_out),
                     "resume_from_checkpoint=auto")
    log_resumed = resumed.communicate(timeout=300)[0]
    log_full = uninterrupted.communicate(timeout=300)[0]
    assert resumed.returncode == 0, log_resumed
    assert uninterrupted.returncode == 0, log_full
    assert f"resumed from {resumed_from}" in log_resumed

    a = load_file(str(full_out / "adapter_model.safetensors"))
    b = load_file(str(killed_out / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name}: max abs diff {(a[name] - b[name]).abs().max()}"


def test_crash_while_writing_leaves_previous_checkpoint(tmp_path, monkeypatch):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    first = ckpt.save_checkpoint(tmp_path, 10, model, opt, sched, None, {"step": 10})

    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(ckpt, "_write_synced", crash)  # dies before trainer_state.json
    with pytest.raises(OSError):
        ckpt.save_checkpoint(tmp_path, 20, model, opt, sched, None, {"step": 20})
    assert (tmp_path / ".checkpoint-20.tmp").exists()  # the debris is there ...
    assert runs_folder.latest_checkpoint(tmp_path) == first  # ... but never picked
    (tmp_path / "checkpoint-30").mkdir()  # a folder without trainer_state.json: incomplete
    assert runs_folder.list_checkpoints(tmp_path) == [first]


def test_save_total_limit_rotates(tmp_path):
    model = torch.nn.Linear(2, 2)
    opt = torch.optim.AdamW(model.parameters())
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    for step in (5, 10, 15):
        ckpt.save_checkpoint(tmp_path, step, model, opt, sched, None, {"step": step})
        ckpt.rotate_checkpoints(tmp_path, 2)
    assert [p.name for p in runs_folder.list_checkpoints(tmp_path)] == ["checkpoint-10", "checkpoint-15"]
