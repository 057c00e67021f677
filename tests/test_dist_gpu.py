"""The 2-process equivalence on two GPUs with NCCL (fp32, tiny model): run with -m gpu on
a machine with at least 2 GPUs (the lent nvidia-h200-x2)."""

from __future__ import annotations

import json

import pytest
import torch

from test_dist_equivalence import (
    ADAPTER,
    FULL,
    WORKER,
    _child_env,
    _max_diff,
    _overrides,
    _run,
    _torchrun,
)
from tiny import save_tiny_model, write_alpaca
from tunesmith.config import load_config
from tunesmith.recipes.sft import run_sft

pytestmark = pytest.mark.gpu


def test_two_gpus_equal_one_gpu(tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    torch.backends.cuda.matmul.allow_tf32 = False
    env = {"model": save_tiny_model(tmp_path / "tiny", "llama"),
           "data": write_alpaca(tmp_path / "train.json", 24), "root": tmp_path}
    # the reference: one process on cuda:0
    for ft in ("lora", "full"):
        run_sft(load_config(overrides=_overrides(env, tmp_path / f"ref-{ft}", 2,
                                                 finetuning_type=ft)))
    specs = [_overrides(env, tmp_path / "ddp-lora", 1),
             _overrides(env, tmp_path / "fsdp-full", 1, finetuning_type="full",
                        fsdp="full_shard")]
    (tmp_path / "specs.json").write_text(json.dumps(specs))
    r = _run(_torchrun(2, str(WORKER), str(tmp_path / "specs.json")),
             _child_env(tmp_path, NCCL_NVLS_ENABLE="0"), timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    # GPU reductions run in another order than on one device: a looser bound than on CPU
    assert _max_diff(tmp_path / "ref-lora" / ADAPTER, tmp_path / "ddp-lora" / ADAPTER) < 1e-4
    assert _max_diff(tmp_path / "ref-full" / FULL, tmp_path / "fsdp-full" / FULL) < 1e-4
