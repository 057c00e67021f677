"""Distributed benchmark of tunesmith's training loop on two GPUs (one call, ~8 minutes).

    python bench/gpu_dist.py                 # 2x H200: writes $OUT/dist_bench.{json,md}
    python bench/gpu_dist.py --tiny          # the same code path on the CPU (gloo), in seconds

On the lent nvidia-h200-x2 machine (Python 3.12, no network), DeepSpeed travels as wheels
in .whl/ (deepspeed, hjson, pydantic, pydantic_core cp312, annotated_types,
typing_inspection, typing_extensions; carry=[".whl"]):

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site;
    PYTHONUNBUFFERED=1 python3 bench/gpu_dist.py --out $OUT

Without deepspeed the ZeRO-3 case is reported as skipped. Each case's full log is kept in
$OUT/<case>.log. A case that runs out of memory is retried once with gradient checkpointing
(recorded in the result).

Cases (each a fresh process group; the 2-process ones under torchrun):

    ddp_lora  x1, x2   LoRA r16 alpha 32 on q,k,v,o,gate,up,down; micro-batch 4 x 2048
    fsdp_full x2       FSDP2 full fine-tuning, bf16 params / fp32 master and reduce, AdamW
    ds_z3_full x2      DeepSpeed ZeRO-3 full fine-tuning (when deepspeed is importable)
    single_full x1, ds_z3_full x1
                       one GPU: ZeRO-3's own cost against the plain loop (bench/z3_sweep.sh;
                       --layers N shortens the model so full fine-tuning fits, --zero
                       KEY=JSON sets a zero_optimization entry, --profile STEPS)

The model is Qwen2.5-7B-shaped (hidden 3584, intermediate 18944, 28 layers, 28 heads,
4 KV heads, vocab 152064, untied), built from its config with random weights on the GPU:
no download, no disk. Samples are random token ids, every position trained. Training
runs through tunesmith's own Trainer, strategies and loss (only loading and tokenising
are skipped). Timing: 5 warm-up steps, then 20 timed steps, from the loop's own clock.
MFU uses tunesmith's FLOP formulas (models/flops.py) against 790 TFLOP/s per H200.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

QWEN7B = dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
              num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
              tie_word_embeddings=False, max_position_embeddings=4096, rope_theta=1e6)
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=384, tie_word_embeddings=False,
            max_position_embeddings=512)
LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
CASES = {  # name: (processes, strategy, finetuning type, micro-batch)
    "ddp_lora_x1": (1, "ddp", "lora", 4),
    "ddp_lora_x2": (2, "ddp", "lora", 4),
    "fsdp_full_x2": (2, "fsdp", "full", 2),
    "ds_z3_full_x2": (2, "deepspeed", "full", 2),
    # one GPU: the ZeRO-3 engine's own cost (hooks, flat buffers, optimizer) against the
    # plain loop on the same model, with no communication to hide it
    "single_full_x1": (1, "single", "full", 2),
    "ds_z3_full_x1": (1, "deepspeed", "full", 2),
}


# ----- one case (runs in every rank) -------------------------------------------------------
def run_case(a: argparse.Namespace) -> None:
    import torch

    from tunesmith.cli.setup import setup_process
    from tunesmith.config.environment import distributed_env
    from tunesmith.config.schema import FinetuningConfig, TrainingConfig
    from tunesmith.distributed.context import all_reduce_sum, init_distributed
    from tunesmith.distributed.strategy import build_strategy

    setup_process(a.seed, rank=distributed_env()["rank"])
    _, strategy, ft, mb = CASES[a.case]
    seq = 64 if a.tiny else a.seq
    mb = a.micro_batch or mb
    cfg = TrainingConfig(output_dir=str(a.out / a.case), per_device_train_batch_size=mb,
                         max_steps=a.warmup + a.steps, learning_rate=1e-5, bf16=not a.tiny,
                         lr_scheduler_type="constant", logging_steps=1, save_steps=0,
                         gradient_checkpointing="true" if a.checkpointing else "false",
                         ddp_timeout=600, seed=a.seed)
    if strategy == "fsdp":
        cfg.fsdp = ["full_shard"]
    if strategy == "deepspeed":
        cfg.deepspeed = ds_json(a)
    ctx = init_distributed("auto", "auto", cfg.ddp_timeout)
    torch.manual_seed(a.seed)
    model = build_model(a.tiny, ft, ctx.device, a.layers)
    from tunesmith.adapters.setup import prepare_trainable

    model = prepare_trainable(model, FinetuningConfig(
        finetuning_type=ft, lora_rank=16, lora_alpha=32, lora_target=LORA_TARGETS), [])
    from tunesmith.config.schema import Config, ModelConfig
    from tunesmith.recipes.sft import apply_speed_settings

    # LoRA cases use regional compilation, tunesmith's fastest single-GPU setting
    compile_layers = compile_layers_used(ft, a)
    apply_speed_settings(model, Config(model=ModelConfig(torch_compile=compile_layers),
                                       training=cfg))
    result = train(model, cfg, ctx, build_strategy(cfg, ctx), seq, mb, ft, a)
    peak = all_reduce_sum([result.pop("peak_mem_gb_rank")], ctx)[0]  # sum over ranks
    result["peak_mem_gb_per_gpu"] = round(peak / ctx.world_size, 2)
    if ctx.is_main:
        (a.out / f"{a.case}.json").write_text(json.dumps(result, indent=2))
    from tunesmith.distributed.context import shutdown_process_group

    shutdown_process_group()


def ds_json(a: argparse.Namespace) -> str:
    """LLaMA-Factory's ds_z3_config.json, with --zero KEY=VALUE entries of
    zero_optimization set (written next to the results; JSON values: 5e8, true, "auto")."""
    path = ROOT / "examples" / "deepspeed" / "ds_z3_config.json"
    if not a.zero:
        return str(path)
    conf = json.loads(path.read_text())
    for item in a.zero:
        key, _, value = item.partition("=")
        conf["zero_optimization"][key] = json.loads(value)
    out = a.out / f"{a.case}_ds.json"
    out.write_text(json.dumps(conf, indent=2))
    return str(out)


def build_model(tiny: bool, ft: str, device, layers: int = 0):
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    shape = dict(TINY if tiny else QWEN7B)
    if layers:
        shape["num_hidden_layers"] = layers
    cfg = Qwen2Config(**shape)
    # a frozen base is stored in bf16; full fine-tuning keeps fp32 masters (bf16 compute)
    dtype = torch.float32 if tiny or ft == "full" else torch.bfloat16
    with torch.device(device):
        return AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")


def train(model, cfg, ctx, strategy, seq: int, mb: int, ft: str, a) -> dict:
    import numpy as np
    import torch

    from tunesmith.data.encode import EncodedSample
    from tunesmith.models.flops import build_flop_model
    from tunesmith.train.loop import Trainer
    from tunesmith.train.objective import NextTokenObjective
    from tunesmith.train.throughput import device_peak_flops

    rng = np.random.default_rng(a.seed)
    vocab = model.config.vocab_size
    n = mb * ctx.world_size * cfg.max_steps
    samples = [EncodedSample(ids, ids.copy()) for ids in
               rng.integers(0, vocab, size=(n, seq), dtype=np.int64).astype(np.int32)]
    flop_model = build_flop_model(model, full=ft == "full")
    prof = step_profiler(a) if a.profile and ctx.is_main else None
    if prof is not None:
        label_phases(strategy)
    log = RecordingLog(prof)
    trainer = Trainer(model, NextTokenObjective(), samples, [], cfg, pad_id=0,
                      device=ctx.device, output_dir=Path(cfg.output_dir), metrics=log,
                      strategy=strategy)
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    if prof is not None:
        prof.start()
    trainer.run()
    if prof is not None:
        prof.stop()
    t = {r["step"]: r["elapsed_s"] for r in log.records if "elapsed_s" in r}
    # every rank gets the same t through the all-reduced loss (rank 0 records)
    timed = t.get(a.warmup + a.steps, 0.0) - t.get(a.warmup, 0.0) if ctx.is_main else 0.0
    step_s = timed / a.steps
    tokens_per_gpu = mb * seq / step_s if step_s else 0.0
    flops_per_gpu = mb * flop_model.sequence_flops(seq) / step_s if step_s else 0.0
    peak = device_peak_flops(ctx.device)
    mem = (torch.cuda.max_memory_allocated(ctx.device) / 1e9 if ctx.device.type == "cuda"
           else 0.0)
    return {"case": a.case, "gpus": ctx.world_size, "strategy": strategy.name,
            "finetuning_type": ft, "micro_batch": mb, "seq_len": seq,
            "gradient_checkpointing": bool(a.checkpointing), "warmup_steps": a.warmup,
            "layers": model.config.num_hidden_layers, "zero": a.zero,
            "zero3_whole_layers": getattr(strategy, "fetch_units", None),
            "torch_compile": compile_layers_used(ft, a),
            "timed_steps": a.steps, "step_s": round(step_s, 4),
            "tokens_per_s": round(tokens_per_gpu * ctx.world_size, 1),
            "tokens_per_s_per_gpu": round(tokens_per_gpu, 1),
            "tflops_per_gpu": round(flops_per_gpu / 1e12, 2),
            "mfu": round(flops_per_gpu / peak, 4) if peak else None,
            "final_loss": trainer.state.last_loss, "peak_mem_gb_rank": mem,
            "device": torch.cuda.get_device_name(ctx.device) if ctx.device.type == "cuda"
            else "cpu"}


def label_phases(strategy) -> None:
    """Name the strategy's backward and step in the profile (rows "phase: ...")."""
    from torch.profiler import record_function

    for name in ("backward", "finish_step"):
        inner = getattr(strategy, name)

        def labelled(*args, _inner=inner, _name=name, **kw):
            with record_function(f"phase: {_name}"):
                return _inner(*args, **kw)

        setattr(strategy, name, labelled)


def step_profiler(a: argparse.Namespace):
    """torch.profiler over --profile steps after the warm-up; the tables (by GPU time and
    by host time) go to <out>/<case>_profile.txt."""
    from torch.profiler import ProfilerActivity, profile, schedule

    def write(p) -> None:
        table = p.key_averages()
        text = [f"{a.case}: {a.profile} profiled steps after {a.warmup} warm-up steps", "",
                "## by device time", table.table(sort_by="self_device_time_total",
                                                   row_limit=40, max_name_column_width=70),
                "## by host time", table.table(sort_by="self_cpu_time_total", row_limit=40,
                                                 max_name_column_width=70),
                "## phases (host and device totals)"] + [
                    f"{e.key}: host {e.cpu_time_total / 1e3:.1f} ms, device "
                    f"{e.device_time_total / 1e3:.1f} ms, calls {e.count}"
                    for e in table if e.key.startswith(("phase:", "ProfilerStep"))]
        (a.out / f"{a.case}_profile.txt").write_text("\n".join(text))

    return profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                   schedule=schedule(wait=a.warmup - 1, warmup=1, active=a.profile),
                   on_trace_ready=write)


class RecordingLog:
    """Stands in for MetricsLog: keeps the loop's per-step records in memory, and steps
    the profiler (--profile) once per optimizer step."""

    def __init__(self, profiler=None) -> None:
        self.records: list[dict] = []
        self.profiler = profiler

    def write(self, record: dict) -> None:
        self.records.append(record)
        if self.profiler is not None and "loss" in record:
            self.profiler.step()

    def close(self) -> None:
        pass


# ----- the driver (no torch.distributed here) ------------------------------------------------
def drive(a: argparse.Namespace) -> int:
    a.out.mkdir(parents=True, exist_ok=True)
    # NVLink multicast stays off on the lent machines (see the device notes)
    env = dict(os.environ, NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1",
               NVSHMEM_DISABLE_NVLS="1", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]))
    env.pop("NPROC_PER_NODE", None)
    if a.tiny:  # two CPU cores: one thread per process, as torchrun gives its ranks
        env["OMP_NUM_THREADS"] = "1"
    start = time.monotonic()
    results = []
    for name in a.cases.split(","):
        result = drive_case(name, a, env, a.budget - (time.monotonic() - start), a.checkpointing)
        if result["status"] == "oom" and not a.checkpointing:  # retry with recompute
            retry = drive_case(name, a, env, a.budget - (time.monotonic() - start), True)
            result = {**retry, "first_attempt": "out of memory without gradient checkpointing"}
        elif result["status"] == "failed" and "lora" in name and not a.no_compile:
            a.no_compile = True  # a compile failure must not cost the scaling figure
            retry = drive_case(name, a, env, a.budget - (time.monotonic() - start), False)
            result = {**retry, "first_attempt": "failed with torch.compile: "
                      + result.get("log_tail", "")[-300:]}
        results.append(result)
        print(json.dumps({k: v for k, v in result.items() if k != "log_tail"}), flush=True)
    report = {"machine": machine(), "command": " ".join(sys.argv),
              "results": results, "scaling_efficiency": scaling(results),
              "wall_s": round(time.monotonic() - start, 1)}
    (a.out / "dist_bench.json").write_text(json.dumps(report, indent=2))
    (a.out / "dist_bench.md").write_text(table(report))
    print(table(report))
    return 0 if all(r.get("status") == "ok" for r in results) else 1


def compile_layers_used(ft: str, a: argparse.Namespace) -> bool:
    return (ft == "lora" or a.compile_full) and not a.tiny and not a.no_compile


def drive_case(name: str, a: argparse.Namespace, env: dict, left: float,
               checkpointing: bool) -> dict:
    nproc, strategy, _, _ = CASES[name]
    if strategy == "deepspeed" and not deepspeed_importable(env):
        return {"case": name, "status": "skipped", "reason": "deepspeed is not installed"}
    if left < 60:
        return {"case": name, "status": "skipped", "reason": f"time budget spent ({left:.0f} s left)"}
    argv = [str(Path(__file__).resolve()), "--case", name, "--out", str(a.out),
            "--steps", str(a.steps), "--warmup", str(a.warmup), "--seq", str(a.seq)]
    argv += ["--micro-batch", str(a.micro_batch)] if a.micro_batch else []
    argv += ["--tiny"] if a.tiny else []
    argv += ["--checkpointing"] if checkpointing else []
    argv += ["--no-compile"] if a.no_compile else []
    argv += ["--compile-full"] if a.compile_full else []
    argv += ["--layers", str(a.layers)] if a.layers else []
    argv += [f"--zero={z}" for z in a.zero]
    argv += ["--profile", str(a.profile)] if a.profile else []
    from tunesmith.distributed.launch import free_port

    cmd = ([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
            "--master_addr", "127.0.0.1", "--master_port", str(free_port())]
           if nproc > 1 else [sys.executable]) + argv
    (a.out / f"{name}.json").unlink(missing_ok=True)
    t0 = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=min(a.case_timeout, left))
        rc, log = p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        rc, log = 124, f"timed out after {exc.timeout:.0f} s\n" + str(exc.stderr or "")[-4000:]
    (a.out / f"{name}.log").write_text(log if isinstance(log, str) else str(log))
    out = a.out / f"{name}.json"
    if rc == 0 and out.is_file():
        return {**json.loads(out.read_text()), "status": "ok",
                "wall_s": round(time.monotonic() - t0, 1)}
    oom = "OutOfMemoryError" in log or "CUDA out of memory" in log
    return {"case": name, "status": "oom" if oom else "failed", "exit_code": rc,
            "wall_s": round(time.monotonic() - t0, 1), "log_tail": log[-1500:]}


def deepspeed_importable(env: dict) -> bool:
    probe = subprocess.run([sys.executable, "-c", "import deepspeed"], env=env,
                           capture_output=True)
    return probe.returncode == 0


def scaling(results: list[dict]) -> float | None:
    by = {r["case"]: r for r in results if r.get("status") == "ok"}
    if "ddp_lora_x1" in by and "ddp_lora_x2" in by:
        one, two = by["ddp_lora_x1"]["tokens_per_s"], by["ddp_lora_x2"]["tokens_per_s"]
        return round(two / (2 * one), 4) if one else None
    return None


def machine() -> dict:
    import platform

    import torch
    import transformers

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "host": platform.node()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["cuda"] = torch.version.cuda
        info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return info


def table(report: dict) -> str:
    head = ("| case | GPUs | strategy | tuning | micro-batch x seq | step s | tokens/s | "
            "tokens/s/GPU | TFLOP/s/GPU | MFU | peak mem GB/GPU | status |")
    lines = ["# Distributed training benchmark (tunesmith Trainer)", "",
             f"machine: {json.dumps(report['machine'])}", "",
             f"command: `{report['command']}`", "", head, "|" + "---|" * 12]
    for r in report["results"]:
        if r.get("status") != "ok":
            lines.append(f"| {r['case']} | | | | | | | | | | | {r['status']}: "
                         f"{r.get('reason', 'see ' + r['case'] + '.log')} |")
            continue
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a"
        lines.append(f"| {r['case']} | {r['gpus']} | {r['strategy']} | {r['finetuning_type']} "
                     f"| {r['micro_batch']} x {r['seq_len']} | {r['step_s']} | "
                     f"{r['tokens_per_s']:.0f} | {r['tokens_per_s_per_gpu']:.0f} | "
                     f"{r['tflops_per_gpu']} | {mfu} | {r['peak_mem_gb_per_gpu']} | ok |")
    eff = report["scaling_efficiency"]
    lines += ["", "DDP LoRA scaling efficiency (2-GPU tokens/s / (2 x 1-GPU tokens/s)): "
              + (f"{eff:.3f}" if eff is not None else "n/a"),
              "", "MFU: tunesmith's FLOP model (models/flops.py; 6N/token full, 4N/token LoRA, "
              "+ attention) against 790 TFLOP/s per H200 (measured bf16 matmul peak)."]
    return "\n".join(lines) + "\n"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="tiny model on the CPU (gloo)")
    p.add_argument("--case", choices=sorted(CASES), help=argparse.SUPPRESS)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench-out")))
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--micro-batch", type=int, default=0, help="0: the case's default")
    p.add_argument("--checkpointing", action="store_true", help="gradient checkpointing")
    p.add_argument("--budget", type=float, default=500.0, help="seconds for all cases")
    p.add_argument("--no-compile", action="store_true", help="LoRA cases without torch.compile")
    p.add_argument("--compile-full", action="store_true", help="compile full fine-tuning too")
    p.add_argument("--case-timeout", type=float, default=170.0)
    p.add_argument("--profile", type=int, default=0, metavar="STEPS",
                   help="profile this many steps after the warm-up (torch.profiler tables); "
                   "they fall inside the timed steps, so time in a run without it")
    p.add_argument("--layers", type=int, default=0, help="decoder layers (0: the shape's 28)")
    p.add_argument("--zero", action="append", default=[], metavar="KEY=JSON",
                   help="set a zero_optimization entry of the ZeRO-3 JSON (repeatable)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse()
    if args.case:
        run_case(args)
    else:
        raise SystemExit(drive(args))
