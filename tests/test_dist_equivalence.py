"""Two gloo processes equal one process: DDP and FSDP2, LoRA / freeze / full, checkpoints
that resume on 2 ranks and load on 1, a two-"node" run, and a rank that dies.

Every run trains the tiny model for 4 optimizer steps. AdamW alone would hide a wrong
gradient scale (its update is scale-free), so adam_epsilon is 1.0 and clipping is off: the
update is then about learning_rate x gradient, and a rank that scaled its loss wrongly
would show. The weights move by ~1e-3, far above the 1e-5 tolerance. A 1-process run uses
micro-batch 2; a 2-process run micro-batch 1 per rank: the same samples per step.
torchrun launches cost seconds, so the runs are made once per module and shared.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tiny import save_tiny_model, write_alpaca
from tunesmith.config import load_config
from tunesmith.recipes.sft import run_sft

WORKER = Path(__file__).with_name("dist_worker.py")
SRC = Path(__file__).resolve().parents[1] / "src"
TOL = 1e-5
EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "deepspeed"
ADAPTER, FULL = "adapter_model.safetensors", "model.safetensors"


def _overrides(env: dict, out: Path, bs: int, **kw) -> dict:
    base = {"model_name_or_path": str(env["model"]), "dataset": str(env["data"]),
            "output_dir": str(out), "max_steps": 4, "save_steps": 2, "logging_steps": 1,
            "learning_rate": 0.05, "adam_epsilon": 1.0, "max_grad_norm": 0.0, "lora_rank": 4, "per_device_train_batch_size": bs,
            "overwrite_output_dir": True, "freeze_trainable_layers": 1}
    return {**base, **kw}


def _child_env(root: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
    env.update(TUNESMITH_CACHE=str(root / "cache"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(SRC), env.get("PYTHONPATH", "")]), **extra)
    return env


def _run(cmd: list[str], env: dict, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def _torchrun(nproc: int, *args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(_port()), *args]


def _port() -> int:
    from tunesmith.distributed.launch import free_port

    return free_port()


def _max_diff(a: Path, b: Path) -> float:
    x, y = load_file(str(a)), load_file(str(b))
    assert set(x) == set(y) and x
    return max((x[k].float() - y[k].float()).abs().max().item() for k in x)


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]


def _has_deepspeed() -> bool:
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Make every run once: references in this process, the rest in ONE torchrun launch of
    2 processes that share a process group (each launch costs seconds of start-up)."""
    root = tmp_path_factory.mktemp("dist")
    env = {"model": save_tiny_model(root / "tiny", "llama"),
           "data": write_alpaca(root / "train.json", 24), "root": root}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNESMITH_CACHE", str(root / "cache"))
        mp.setenv("HF_HUB_OFFLINE", "1")
        for ft in ("lora", "full", "freeze"):
            run_sft(load_config(overrides=_overrides(env, root / f"ref-{ft}", 2,
                                                     finetuning_type=ft)))

    def run(name: str, ft: str = "lora", **kw) -> dict:
        return _overrides(env, root / name, 1, finetuning_type=ft, **kw)

    def resumed(name: str, ft: str, **kw) -> dict:
        return run(f"{name}-resumed", ft, resume_from_checkpoint=str(root / name /
                                                                     "checkpoint-2"), **kw)

    specs = [run("ddp-lora"), run("ddp-full", "full"), run("ddp-freeze", "freeze"),
             run("fsdp-full", "full", fsdp="full_shard"), run("fsdp-lora", fsdp="full_shard"),
             run("fsdp-freeze", "freeze", fsdp="shard_grad_op"),
             resumed("ddp-lora", "lora"), resumed("fsdp-full", "full", fsdp="full_shard")]
    if _has_deepspeed():
        def ds(name: str, ft: str, cfg: str, **kw) -> dict:
            return run(name, ft, deepspeed=str(EXAMPLES / cfg), **kw)

        specs += [ds("z2-lora", "lora", "ds_z2_config.json"),
                  ds("z3-full", "full", "ds_z3_config.json"),
                  ds("z3-freeze", "freeze", "ds_z3_offload_config.json"),
                  resumed("z3-full", "full", deepspeed=str(EXAMPLES / "ds_z3_config.json"))]
    (root / "specs.json").write_text(json.dumps(specs))
    b = _run(_torchrun(2, str(WORKER), str(root / "specs.json")), _child_env(root),
             timeout=900)  # 12 runs, 4 of them DeepSpeed, on 2 shared cores
    assert b.returncode == 0, b.stderr[-3000:]
    return env


def test_ddp_lora_two_ranks_equal_one_process(runs):
    root = runs["root"]
    assert _max_diff(root / "ref-lora" / ADAPTER, root / "ddp-lora" / ADAPTER) < TOL
    moved = load_file(str(root / "ref-lora" / ADAPTER))
    assert max(t.abs().max().item() for k, t in moved.items() if "lora_B" in k) > 1e-4
    ref, ddp = _losses(root / "ref-lora"), _losses(root / "ddp-lora")
    assert len(ddp) == 4  # one writer: rank 0
    assert ddp == pytest.approx(ref, abs=1e-5)


@pytest.mark.parametrize("run", ["fsdp-full", "fsdp-lora", "fsdp-freeze", "ddp-full",
                                 "ddp-freeze"])
def test_strategies_equal_one_process(runs, run):
    root = runs["root"]
    ft = run.split("-")[1]
    name = ADAPTER if ft == "lora" else FULL
    assert _max_diff(root / f"ref-{ft}" / name, root / run / name) < TOL
    if ft != "lora":  # the run really trained: weights moved well beyond the tolerance
        assert _max_diff(runs["model"] / FULL, root / run / FULL) > 1e-4
    summary = json.loads((root / run / "run_summary.json").read_text())
    assert summary["performance"]["world_size"] == 2
    assert summary["performance"]["strategy"] == run.split("-")[0]


@pytest.mark.parametrize("run,ft", [("ddp-lora-resumed", "lora"),
                                    ("fsdp-full-resumed", "full")])
def test_checkpoint_of_two_ranks_resumes_on_two(runs, run, ft):
    root = runs["root"]
    name = ADAPTER if ft == "lora" else FULL
    assert _max_diff(root / f"ref-{ft}" / name, root / run / name) < TOL
    assert [json.loads(x)["step"] for x in (root / run / "metrics.jsonl").read_text()
            .splitlines()] == [3, 4]


@pytest.mark.parametrize("src,ft", [("ddp-lora", "lora"), ("fsdp-full", "full")])
def test_checkpoint_of_two_ranks_loads_on_one(runs, src, ft, tmp_path):
    root = runs["root"]
    out = tmp_path / "one"
    # same plan (micro-batch 1) and same samples per step (2 micro-batches accumulated)
    run_sft(load_config(overrides=_overrides(
        runs, out, 1, finetuning_type=ft, gradient_accumulation_steps=2,
        resume_from_checkpoint=str(root / src / "checkpoint-2"))))
    name = ADAPTER if ft == "lora" else FULL
    assert _max_diff(root / f"ref-{ft}" / name, out / name) < TOL


def test_sharded_output_loads_on_one_device(runs):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root = runs["root"]
    full = AutoModelForCausalLM.from_pretrained(root / "fsdp-full")
    ids = torch.tensor([[1, 5, 7, 9]])
    assert torch.isfinite(full(input_ids=ids).logits).all()
    base = AutoModelForCausalLM.from_pretrained(runs["model"])
    tuned = PeftModel.from_pretrained(base, root / "fsdp-lora")
    assert torch.isfinite(tuned(input_ids=ids).logits).all()
    assert not list((root / "fsdp-lora" / ".cache").iterdir())  # data hand-off cleaned up


def test_two_nodes_on_one_machine_match(runs):
    """Two torchrun agents (NNODES=2, one process each) meeting at 127.0.0.1, sharding
    with FSDP2 hybrid_shard (replicate across the nodes)."""
    root = runs["root"]
    out = root / "two-node"
    args = [f"{k}={v}" for k, v in _overrides(runs, out, 1, finetuning_type="full",
                                              fsdp="hybrid_shard").items()]
    port = str(_port())
    procs = [subprocess.Popen([sys.executable, "-m", "tunesmith", "train", *args],
                              env=_child_env(root, NNODES="2", NODE_RANK=str(r),
                                             NPROC_PER_NODE="1", MASTER_ADDR="127.0.0.1",
                                             MASTER_PORT=port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in (0, 1)]
    logs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "node 1 of 2" in logs[1]
    assert _max_diff(root / "ref-full" / FULL, out / FULL) < TOL
    summary = json.loads((out / "run_summary.json").read_text())
    assert summary["performance"]["world_size"] == 2


def test_dead_rank_stops_the_others_with_its_error(tmp_path):
    t0 = time.monotonic()
    r = _run(_torchrun(2, str(WORKER), "--fail"), _child_env(tmp_path), timeout=60)
    elapsed = time.monotonic() - t0
    assert r.returncode != 0
    assert elapsed < 45  # rank 0 was blocked in a collective: it did not hang
    report = r.stderr.split("Root Cause")[-1]
    assert "rank      : 1" in report
    assert "injected failure on purpose" in report


@pytest.mark.parametrize("run,ft", [("z2-lora", "lora"), ("z3-full", "full"),
                                    ("z3-freeze", "freeze"), ("z3-full-resumed", "full")])
def test_deepspeed_zero_equals_one_process(runs, run, ft):
    # deepspeed is in the dev extra (it installs without building its CUDA ops)
    assert _has_deepspeed(), "deepspeed is missing: pip install -e '.[dev]'"
    root = runs["root"]
    name = ADAPTER if ft == "lora" else FULL
    assert _max_diff(root / f"ref-{ft}" / name, root / run / name) < TOL
    if run == "z3-full":
        assert (root / run / "checkpoint-2" / "deepspeed").is_dir()
