"""The launchers of tests/test_launchers.py on two GPUs with NCCL (fp32, tiny model), without
their CPU settings: accelerate launch (MULTI_GPU, LLaMA-Factory's fsdp_config.yaml),
`deepspeed --include localhost:0,1`, and Ray Train with one GPU per worker. Run with
-m gpu on a machine with at least 2 GPUs (the lent nvidia-h200-x2)."""

from __future__ import annotations

import importlib.util
import sys

import pytest
import torch
import yaml

from test_launchers import BIN, FSDP_CONFIG, _launch, _losses, _max_diff, _performance, _settings
from tiny import save_tiny_model, write_alpaca
from tunesmith.config import load_config
from tunesmith.distributed.launch import free_port
from tunesmith.recipes.sft import run_sft

pytestmark = pytest.mark.gpu
TOL = 1e-4  # GPU reductions run in another order than on one device
NCCL = {"NCCL_NVLS_ENABLE": "0"}


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 CUDA GPUs")
    torch.backends.cuda.matmul.allow_tf32 = False
    root = tmp_path_factory.mktemp("launchers-gpu")
    save_tiny_model(root / "tiny", "llama")
    write_alpaca(root / "train.json", 24)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNESMITH_CACHE", str(root / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        run_sft(load_config(overrides=_settings(root, "ref", batch=2)))  # one GPU
    return root / "ref"


def _check(ref, out, strategy: str) -> None:
    perf = _performance(out)
    assert (perf["world_size"], perf["strategy"]) == (2, strategy)
    assert _losses(out) == pytest.approx(_losses(ref), abs=TOL)
    assert _max_diff(ref, out) < TOL


def test_accelerate_launchers_on_two_gpus(ref):
    root = ref.parent
    config = root / "multi_gpu.yaml"
    config.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
        "num_processes": 2, "main_process_port": free_port()}))
    acc = [str(BIN / "accelerate"), "launch", "--config_file"]
    _check(ref, _launch(root, "acc-ddp", [*acc, str(config), "-m", "tunesmith", "train"],
                        env=NCCL), "ddp")
    _check(ref, _launch(root, "acc-fsdp", [*acc, str(FSDP_CONFIG), "--main_process_port",
                                           str(free_port()), "-m", "tunesmith", "train"],
                        env=NCCL), "fsdp")


def test_deepspeed_launcher_on_two_gpus(ref):
    root = ref.parent
    out = _launch(root, "ds", [str(BIN / "deepspeed"), "--include", "localhost:0,1",
                               "--master_port", str(free_port()), "--module", "tunesmith",
                               "train"], env=NCCL)
    _check(ref, out, "ddp")


def test_ray_train_on_two_gpus(ref):
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed: pip install 'tunesmith[ray]'")
    root = ref.parent
    out = _launch(root, "ray", [sys.executable, "-m", "tunesmith", "train"], env=NCCL,
                  use_ray=True, ray_num_workers=2, ray_storage_path=str(root / "ray-saves"),
                  ray_init_kwargs={"include_dashboard": False})
    _check(ref, out, "ddp")
    assert "1 GPU each" in (root / "ray.log").read_text()  # the default on a GPU cluster
