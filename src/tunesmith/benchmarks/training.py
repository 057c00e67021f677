"""GPU training benchmark: tunesmith against transformers + PEFT (+ liger-kernel), side by side.

    W1 dense:        Qwen2.5-7B shapes, LoRA r16/a32 on all 7 projections, 4 x 2048 real tokens
    W2 real-length:  same, log-normal sample lengths (median 256, 16..2048); peers pad per
                     batch of 4, tunesmith packs 8192-token padding-free rows (varlen attention)
    W3 full FT:      Qwen2.5-1.5B shapes, all parameters, AdamW, sequences of 2048
    long context:    W1 model, one sequence as long as fits, offloaded checkpointing

Each case: warm-up steps, then timed optimizer steps between device synchronisations.
Trained tokens/s counts non-pad tokens. MFU uses tunesmith.models.flops (recompute not
credited) against 790 TFLOP/s. Groups run in separate processes so that liger-kernel's
global patches cannot leak into other measurements.
"""

from __future__ import annotations

import gc
import json
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from tunesmith.benchmarks.systems import peer_system, tunesmith_system
from tunesmith.benchmarks.workloads import (
    build_model,
    lognormal_lengths,
    make_samples,
    packed_batches,
    padded_batches,
)
from tunesmith.models.flops import FlopModel, build_flop_model

PEAK_FLOPS = 790e12


@dataclass
class Case:
    workload: str
    system: str
    checkpointing: str
    lora: bool = True
    compile: bool = False
    packed: bool = False
    liger: bool = False
    seq_len: int = 2048
    micro_batch: int = 4


@dataclass
class Result:
    case: Case
    tokens_per_s: float = 0.0
    mfu: float = 0.0
    step_s: float = 0.0
    peak_alloc_gb: float = 0.0
    peak_reserved_gb: float = 0.0
    final_loss: float = float("nan")
    padding_share: float = 0.0
    steps: int = 0
    error: str = ""
    notes: list[str] = field(default_factory=list)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(system, batches, warmup: int, steps: int, flop_model: FlopModel) -> Result:
    _sync()
    for i in range(warmup):
        system.step(batches[i % len(batches)])
    _sync()
    timed = [batches[(warmup + i) % len(batches)] for i in range(steps)]
    start = time.perf_counter()
    loss = None
    for b in timed:
        loss = system.step(b)
    _sync()
    elapsed = time.perf_counter() - start
    tokens = sum(b.n_tokens for b in timed)
    slots = sum(b.input_ids.numel() for b in timed)
    flops = sum(flop_model.sequence_flops(n) for b in timed for n in b.lengths())
    return Result(case=None, tokens_per_s=tokens / elapsed, mfu=flops / elapsed / PEAK_FLOPS,
                  step_s=elapsed / steps, final_loss=float(loss), steps=steps,
                  padding_share=1 - tokens / slots)


def run_case(base: torch.nn.Module, case: Case, warmup: int, steps: int,
             workdir: Path) -> Result:
    gc.collect()
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    system = None
    # full fine-tuning updates (and upcasts) the base in place: every case starts from the same
    snapshot = None if case.lora else {n: p.detach().clone() for n, p in base.named_parameters()}
    try:
        batches = batches_for(case, base.config.vocab_size, warmup + steps)
        if case.system == "tunesmith":
            system = tunesmith_system(base, lora=case.lora, checkpointing=case.checkpointing,
                                      compile=case.compile, varlen=case.packed,
                                      workdir=workdir / "ts")
        else:
            system = peer_system(base, lora=case.lora, checkpointing=case.checkpointing == "true",
                                 liger=case.liger)
        flop_model = build_flop_model(system.model, full=not case.lora)
        result = _timed(system, batches, warmup, steps, flop_model)
    except torch.OutOfMemoryError:
        result = Result(case=case, error="out of memory")
    except Exception as exc:  # noqa: BLE001 - a failing case must not end the benchmark
        result = Result(case=case, error=f"{type(exc).__name__}: {exc}"[:500])
        traceback.print_exc()
    result.case = case
    if cuda:
        result.peak_alloc_gb = torch.cuda.max_memory_allocated() / 1e9
        result.peak_reserved_gb = torch.cuda.max_memory_reserved() / 1e9
    if system is not None:
        try:
            system.teardown()
        except Exception:  # noqa: BLE001
            traceback.print_exc()
    del system
    if snapshot is not None:
        for n, p in base.named_parameters():
            p.data = snapshot[n]
            p.requires_grad_(True)
            p.grad = None
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    print(_line(result), flush=True)
    return result


def _line(r: Result) -> str:
    c = r.case
    name = f"{c.workload:<5} {c.system:<10} ckpt={c.checkpointing:<9} compile={int(c.compile)} " \
           f"packed={int(c.packed)} liger={int(c.liger)}"
    if r.error:
        return f"{name} ERROR {r.error}"
    return (f"{name} {r.tokens_per_s:9.0f} tok/s  MFU {r.mfu:6.1%}  peak {r.peak_alloc_gb:6.1f} GB "
            f"(reserved {r.peak_reserved_gb:6.1f})  loss {r.final_loss:.4f}")


def group_cases(group: str) -> tuple[str, list[Case]]:
    """(model shape, cases) of a group; each group runs in its own process."""
    w1 = dict(workload="W1")
    if group == "main":
        return "qwen2.5-7b", [
            Case(**w1, system="tunesmith", checkpointing="false", compile=True),
            Case(**w1, system="tunesmith", checkpointing="false"),
            Case(**w1, system="tunesmith", checkpointing="true", compile=True),
            Case(**w1, system="tunesmith", checkpointing="offload", compile=True),
            Case(**w1, system="hf+peft", checkpointing="false"),
            Case(**w1, system="hf+peft", checkpointing="true"),
            Case(workload="W2", system="tunesmith", checkpointing="false", packed=True,
                 compile=True),
            Case(workload="W2", system="hf+peft", checkpointing="false"),
            Case(workload="long", system="tunesmith", checkpointing="offload", seq_len=65536,
                 micro_batch=1),
        ]
    if group == "liger":
        return "qwen2.5-7b", [
            Case(**w1, system="hf+peft", checkpointing="false", liger=True),
            Case(**w1, system="hf+peft", checkpointing="true", liger=True),
            Case(workload="W2", system="hf+peft", checkpointing="false", liger=True),
        ]
    if group == "full":
        return "qwen2.5-1.5b", [
            Case(workload="W3", system="tunesmith", checkpointing="false", lora=False,
                 compile=True, micro_batch=8),
            Case(workload="W3", system="tunesmith", checkpointing="false", lora=False,
                 micro_batch=8),
            Case(workload="W3", system="hf+peft", checkpointing="false", lora=False,
                 micro_batch=8),
        ]
    raise ValueError(f"unknown group {group!r}; choose main, liger or full")


def batches_for(case: Case, vocab: int, n_steps: int) -> list:
    if case.workload == "W2":
        lengths = lognormal_lengths(40 * n_steps * case.micro_batch, seed=11, hi=case.seq_len)
        samples = make_samples(lengths, vocab, seed=12)
        if case.packed:
            return packed_batches(samples, case.seq_len * case.micro_batch, pad_id=0)[:n_steps]
        return padded_batches(samples, case.micro_batch, pad_id=0)[:n_steps]
    samples = make_samples([case.seq_len] * (case.micro_batch * n_steps), vocab, seed=7)
    return padded_batches(samples, case.micro_batch, pad_id=0)


def run_group(group: str, out: Path, warmup: int, steps: int, tiny: bool,
              only: str | None = None) -> list[dict[str, Any]]:
    shape, cases = group_cases(group)
    if only:
        cases = [c for c in cases if f"{c.workload}:{c.system}:{c.checkpointing}" in only
                 or c.workload in only.split(",")]
    if tiny:
        shape = "tiny"
        cases = [Case(**{**asdict(c), "seq_len": min(c.seq_len, 256)}) for c in cases]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    t0 = time.perf_counter()
    base = build_model(shape, device, torch.bfloat16 if device.type == "cuda" else torch.float32)
    print(f"built {shape} in {time.perf_counter() - t0:.0f} s", flush=True)
    results = []
    for case in cases:
        w, s = (warmup, steps) if case.workload != "long" else (1, 2)
        r = run_case(base, case, w, s, out)
        results.append(asdict(r))
        (out / f"gpu_train_{group}.json").write_text(json.dumps(results, indent=1))
    return results
