"""External launchers start `tunesmith train` as 2 gloo processes on the CPU, and each run
equals the reference: world size 2, the same losses and the same adapter.

    accelerate launch --config_file multi_gpu.yaml -m tunesmith train cfg.yaml
    accelerate launch --config_file fsdp_config.yaml -m tunesmith train cfg.yaml
                      (LLaMA-Factory's examples/accelerate file, unchanged)
    deepspeed --include localhost:0,1 --master_port P --module tunesmith train cfg.yaml

The reference is one process with micro-batch 2, which test_dist_equivalence.py holds
equal (1e-5) to tunesmith's own launcher (NPROC_PER_NODE=2, torchrun); made in this process
it costs a second instead of a 20-second torchrun launch. Settings as there: adam_epsilon
1.0 and no clipping make the update about learning_rate x gradient, so a rank that scaled
its loss wrongly would show.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tiny import save_tiny_model, write_alpaca
from tunesmith.config import load_config
from tunesmith.distributed.launch import free_port
from tunesmith.recipes.sft import run_sft

SRC = Path(__file__).resolve().parents[1] / "src"
FSDP_CONFIG = Path(__file__).parent / "fixtures" / "llamafactory_accelerate" / "fsdp_config.yaml"
BIN = Path(sys.executable).parent
ADAPTER = "adapter_model.safetensors"
TOL = 1e-5


def _child_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
    env.update(TUNESMITH_CACHE=str(root / "cache"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]), **extra)
    return env


def _settings(root: Path, name: str, batch: int = 1) -> dict:
    return {"model_name_or_path": str(root / "tiny"), "dataset": str(root / "train.json"),
           "output_dir": str(root / name), "max_steps": 4, "logging_steps": 1,
           "learning_rate": 0.05, "adam_epsilon": 1.0, "max_grad_norm": 0.0, "lora_rank": 4,
           "per_device_train_batch_size": batch, "overwrite_output_dir": True}


def _launch(root: Path, name: str, cmd: list[str], env: dict | None = None, **keys) -> Path:
    """Run `cmd` (ending in `train`) on a YAML for `name` (the shared settings plus `keys`)
    with `env` added to the environment; the run's output folder."""
    cfg = root / f"{name}.yaml"
    cfg.write_text(yaml.safe_dump({**_settings(root, name), **keys}))
    r = subprocess.run([*cmd, str(cfg)], env=_child_env(root, **(env or {})),
                       capture_output=True, text=True, timeout=240, cwd=root)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    (root / f"{name}.log").write_text(r.stdout + r.stderr)
    return root / name


def _losses(out: Path) -> list[float]:
    return [json.loads(x)["loss"] for x in (out / "metrics.jsonl").read_text().splitlines()]


def _max_diff(a: Path, b: Path) -> float:
    x, y = load_file(str(a / ADAPTER)), load_file(str(b / ADAPTER))
    assert set(x) == set(y) and x
    return max((x[k] - y[k]).abs().max().item() for k in x)


def _performance(out: Path) -> dict:
    return json.loads((out / "run_summary.json").read_text())["performance"]


@pytest.fixture(scope="module")
def ref(tmp_path_factory) -> Path:
    """One process, micro-batch 2: the same samples per step as 2 ranks of 1."""
    root = tmp_path_factory.mktemp("launchers")
    save_tiny_model(root / "tiny", "llama")
    write_alpaca(root / "train.json", 24)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNESMITH_CACHE", str(root / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        run_sft(load_config(overrides=_settings(root, "ref", batch=2)))
    out = root / "ref"
    moved = load_file(str(out / ADAPTER))  # it trained: far beyond the tolerance
    assert max(t.abs().max().item() for k, t in moved.items() if "lora_B" in k) > 1e-3
    return out


def _assert_same_as(ref: Path, out: Path, strategy: str) -> None:
    perf = _performance(out)
    assert (perf["world_size"], perf["strategy"]) == (2, strategy)
    assert len(_losses(out)) == 4  # one writer: rank 0
    assert _losses(out) == pytest.approx(_losses(ref), abs=TOL)
    assert _max_diff(ref, out) < TOL


def test_accelerate_multi_gpu_config_starts_two_ranks(ref):
    root = ref.parent
    config = root / "multi_gpu.yaml"  # the snippet users copy: MULTI_GPU, 2 processes
    config.write_text(yaml.safe_dump({
        "compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU",
        "num_processes": 2, "main_process_port": free_port()}))
    out = _launch(root, "accelerate-ddp", [str(BIN / "accelerate"), "launch", "--config_file",
                                           str(config), "-m", "tunesmith", "train"])
    _assert_same_as(ref, out, "ddp")


def test_accelerate_with_llamafactory_fsdp_config_runs_fsdp(ref):
    """LLaMA-Factory's examples/accelerate/fsdp_config.yaml as it is (mixed_precision: bf16,
    use_cpu: false): accelerate starts 2 CPU processes, ACCELERATE_USE_FSDP selects fsdp:
    full_shard, and the bf16 request that the YAML does not make is named in a warning."""
    root = ref.parent
    out = _launch(root, "accelerate-fsdp",
                  [str(BIN / "accelerate"), "launch", "--config_file", str(FSDP_CONFIG),
                   "--main_process_port", str(free_port()), "-m", "tunesmith", "train"])
    _assert_same_as(ref, out, "fsdp")
    log = (root / "accelerate-fsdp.log").read_text()
    assert "mixed_precision bf16 (ACCELERATE_MIXED_PRECISION) differs" in log


def test_deepspeed_launcher_starts_two_ranks(ref):
    """deepspeed's own launcher with its CPU accelerator: DS_ACCELERATOR=cpu, and LOCAL_SIZE
    tells it how many CPU "devices" --include may name (it counts NUMA nodes otherwise).
    Each rank gets `--local_rank=N` in front of the verb, which tunesmith moves behind it."""
    root = ref.parent
    out = _launch(root, "deepspeed",
                  [str(BIN / "deepspeed"), "--include", "localhost:0,1", "--master_port",
                   str(free_port()), "--module", "tunesmith", "train"],
                  env={"DS_ACCELERATOR": "cpu", "LOCAL_SIZE": "2"})
    _assert_same_as(ref, out, "ddp")
    assert "--local_rank=1" in (root / "deepspeed.log").read_text()


def test_ray_train_two_cpu_workers_equal_one_process(ref):
    """use_ray with LLaMA-Factory's Ray keys: a local Ray cluster of 2 CPUs, 2 Ray Train
    workers on gloo; rank 0 alone writes output_dir, Ray its record in ray_storage_path."""
    assert importlib.util.find_spec("ray"), "ray is missing: pip install -e '.[dev]'"
    root = ref.parent
    extra = {"use_ray": True, "ray_num_workers": 2, "ray_run_name": "tiny-ray",
             "ray_storage_path": str(root / "ray-saves"), "resources_per_worker": {"CPU": 1},
             "placement_strategy": "SPREAD",
             "ray_init_kwargs": {"num_cpus": 2, "include_dashboard": False}}
    out = _launch(root, "ray", [sys.executable, "-m", "tunesmith", "train"], **extra)
    _assert_same_as(ref, out, "ddp")
    assert (root / "ray-saves" / "tiny-ray").is_dir()
    log = (root / "ray.log").read_text()
    assert "ray: 2 worker(s), 1 CPU each" in log
    assert f"ray: training finished; output in {out}" in log
