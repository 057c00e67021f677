"""Resume is exact with DataLoader workers and dropout: a run resumed from its step-4
checkpoint ends with the same adapter, bit for bit, as the uninterrupted run (the
DataLoader must not draw from the global RNG that the checkpoint restored)."""

from __future__ import annotations

import shutil

import torch
from safetensors.torch import load_file

from tunesmith.cli.main import main


def _train(model_dir, data, out, *extra: str) -> None:
    assert main(["train", f"model_name_or_path={model_dir}", f"dataset={data}",
                 f"output_dir={out}", "max_steps=8", "save_steps=4", "logging_steps=4",
                 "per_device_train_batch_size=2", "lora_rank=4", "lora_dropout=0.3",
                 "learning_rate=5e-3", "seed=7", *extra]) == 0


def test_resumed_run_with_workers_equals_uninterrupted(tmp_path, tiny_llama_dir, alpaca_file):
    loader = ["dataloader_num_workers=1"]  # 0 workers: tests/test_resume.py
    full, resumed = tmp_path / "full", tmp_path / "resumed"
    _train(tiny_llama_dir, alpaca_file, full, *loader)
    resumed.mkdir()
    shutil.copytree(full / "checkpoint-4", resumed / "checkpoint-4")
    _train(tiny_llama_dir, alpaca_file, resumed, *loader, "resume_from_checkpoint=auto")
    a = load_file(str(full / "adapter_model.safetensors"))
    b = load_file(str(resumed / "adapter_model.safetensors"))
    assert a.keys() == b.keys() and a
    for name in a:
        assert torch.equal(a[name], b[name]), f"{name}: {(a[name] - b[name]).abs().max()}"


def test_loader_workers_stop_when_the_run_returns(tmp_path, tiny_llama_dir, alpaca_file):
    """A run in a process that goes on (the Python API, notebooks, several runs in one
    script) stops its DataLoader workers as it returns. Left to a later garbage collection,
    each worker waited 5 s for a stop message its already-closed queue never sent."""
    import multiprocessing

    before = {p.pid for p in multiprocessing.active_children()}
    _train(tiny_llama_dir, alpaca_file, tmp_path / "out", "dataloader_num_workers=2",
           "save_steps=0")
    left = [p for p in multiprocessing.active_children() if p.pid not in before]
    assert left == [], f"DataLoader workers still alive after the run: {left}"
