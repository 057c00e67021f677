"""Where a training step's time and memory go: tunesmith's own step (prepare_trainable +
apply_speed_settings + Trainer.train_step) on a Qwen2.5-7B-shaped model, dense 4 x 2048 rows,
LoRA r16 on all projections, profiled with torch.profiler after warm-up.

    python bench/profile_step.py --out $OUT/profile            (one H200, about 2 minutes)
    python bench/profile_step.py --tiny --out /tmp/profile     (CPU check)

Writes profile.json (GPU time per kernel family, peak memory, tokens/s) and profile.md (the
top kernels). Options: --fused-lora-mlp auto|false, --checkpointing false|true|offload,
--compile / --no-compile, --mlp-chunks N, --memory (one more step under torch's allocator history: what is
alive at the step's peak, grouped by where it was allocated, in memory.md).
"""

from __future__ import annotations

import argparse
import json
import linecache
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from tunesmith.benchmarks.workloads import SHAPES, build_model, make_samples, padded_batches  # noqa: E402

FAMILIES = [("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas", "addmm", "mm")),
            ("attention", ("flash", "fmha", "attention")),
            ("compiled elementwise", ("triton_",)),
            ("copies", ("copy", "cat", "memcpy", "memset", "fill")),
            ("reductions", ("reduce", "softmax", "logsumexp", "sum"))]


def family(name: str) -> str:
    low = name.lower()
    for fam, keys in FAMILIES:
        if any(k in low for k in keys):
            return fam
    return "other"


def build_system(opts, device):
    from tunesmith.benchmarks.systems import tunesmith_system

    shape = "tiny" if opts.tiny else "qwen2.5-7b"
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    base = build_model(shape, device, dtype)
    overrides = {"fused_lora_mlp": opts.fused_lora_mlp}
    if opts.attention:  # otherwise varlen on a GPU, as before
        overrides["attn_implementation"] = opts.attention
    system = tunesmith_system(base, lora=True, checkpointing=opts.checkpointing,
                              compile=opts.compile, varlen=device.type == "cuda",
                              workdir=Path(opts.work), extra=overrides, lagged=opts.lagged)
    if opts.mlp_chunks:  # the fused MLP's backward in this many token blocks
        from tunesmith.kernels.fused import FusedSwiGLUMLP

        for module in system.model.modules():
            if isinstance(module, FusedSwiGLUMLP):
                module.backward_chunks = opts.mlp_chunks
    if not opts.pack:  # the fused MLP with gate and up as separate GEMMs (before packing)
        from tunesmith.kernels.fused import FusedSwiGLUMLP

        for module in system.model.modules():
            if isinstance(module, FusedSwiGLUMLP):
                module.unpack()
    return system, SHAPES[shape]["vocab_size"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="profile-out")
    ap.add_argument("--work", default="/tmp/tunesmith-profile")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--fused-lora-mlp", default="auto", choices=["auto", "true", "false"])
    ap.add_argument("--checkpointing", default="false")
    ap.add_argument("--attention", default="",
                    help="attn_implementation (sdpa, eager, varlen; default varlen on a GPU)")
    ap.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    ap.add_argument("--lagged", action=argparse.BooleanOptionalAction, default=True,
                    help="steps without a host sync, as `tunesmith train` runs them")
    ap.add_argument("--pack", action=argparse.BooleanOptionalAction, default=True,
                    help="gate and up of the fused LoRA MLP as one GEMM")
    ap.add_argument("--mlp-chunks", type=int, default=0,
                    help="token blocks of the fused MLP's backward (default: as the mode sets)")
    ap.add_argument("--memory-budget", type=float, default=1.0,
                    help="torch._functorch activation_memory_budget for compiled layers")
    ap.add_argument("--memory", action="store_true",
                    help="also write memory.md: what is alive at one step's peak")
    ap.add_argument("--warmup", type=int, default=4)
    ap.add_argument("--steps", type=int, default=3)
    opts = ap.parse_args(argv)
    cuda = torch.cuda.is_available() and not opts.tiny
    device = torch.device("cuda" if cuda else "cpu")
    opts.compile = opts.compile and cuda
    if opts.memory_budget < 1.0:  # the partitioner recomputes more to keep less (experiment)
        import torch._functorch.config as functorch_config

        functorch_config.activation_memory_budget = opts.memory_budget
    system, vocab = build_system(opts, device)
    rows, length = (4, 2048) if cuda else (2, 64)
    samples = make_samples([length] * rows * (opts.warmup + 2 * opts.steps), vocab, seed=0)
    batches = [b.to(device) for b in padded_batches(samples, rows, pad_id=0)]
    for b in batches[:opts.warmup]:
        system.step(b)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    for b in batches[opts.warmup + opts.steps:]:  # timed without the profiler
        system.step(b)
    if cuda:
        torch.cuda.synchronize()
    plain_s = time.perf_counter() - start
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with torch.profiler.profile(activities=activities) as prof:
        for b in batches[opts.warmup:opts.warmup + opts.steps]:
            system.step(b)
        if cuda:
            torch.cuda.synchronize()
    wall = time.perf_counter() - start
    report(opts, prof, wall, rows * length * opts.steps, cuda, plain_s)
    if opts.memory and cuda:
        memory_at_peak(system, batches[opts.warmup], Path(opts.out))
    return 0


def _site(frames: list[dict]) -> str:
    """Where an allocation was made: the innermost frames in tunesmith, transformers, peft
    or a compiled graph's generated code (torch's own frames are skipped)."""
    keep = []
    for f in frames:
        name = f.get("filename", "")
        if any(k in name for k in ("tunesmith", "transformers/", "peft/", "torchinductor_")):
            short = name.rsplit("/", 2)
            site = f"{'/'.join(short[-2:])}:{f.get('line')} {f.get('name')}"
            if "torchinductor_" in name:  # generated code: its line shows the buffer's shape
                site += " " + linecache.getline(name, f.get("line", 0)).strip()[:90]
            keep.append(site)
        if len(keep) == 2:
            break
    return " <- ".join(keep) or "(torch internals)"


def _replay(events: list[dict], upto: int):
    """Replay allocations and frees up to event `upto`: with upto = all, (peak bytes, index of
    the event that reached it); otherwise (bytes alive, the alloc events alive)."""
    live: dict[int, dict] = {}
    now = peak = at = 0
    for i, ev in enumerate(events[:upto]):
        if ev["action"] == "alloc":
            live[ev["addr"]] = ev
            now += ev["size"]
            if now > peak:
                peak, at = now, i
        elif ev["action"] == "free_completed" and ev["addr"] in live:
            now -= live.pop(ev["addr"])["size"]
    return (peak, at) if upto == len(events) else (now, live)


def memory_at_peak(system, batch, out: Path, top: int = 30) -> None:
    """Run one step under the allocator's history and list the blocks alive at its highest
    point, grouped by allocation site."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.memory._record_memory_history(max_entries=2_000_000, stacks="python")
    system.step(batch)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    events = [ev for trace in snap["device_traces"] for ev in trace]
    peak, at = _replay(events, len(events))
    _, peak_live = _replay(events, at + 1)
    groups: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for size, site in ((ev["size"], _site(ev.get("frames", []))) for ev in peak_live.values()):
        groups[site][0] += size
        groups[site][1] += 1
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    lines = ["# Memory at one step's peak", "",
             f"allocated before the step (weights, optimizer state, kept buffers): "
             f"{base / 1e9:.2f} GB; peak of the step over that: {peak / 1e9:.2f} GB; "
             f"max_memory_allocated {torch.cuda.max_memory_allocated() / 1e9:.2f} GB", "",
             "| MB | blocks | allocated at |", "|---:|---:|---|"]
    lines += [f"| {size / 1e6:,.0f} | {n} | `{site}` |" for site, (size, n) in rows[:top]]
    (out / "memory.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:20]))


def idle_gaps(prof, min_us: float = 200.0) -> dict:
    """GPU idle time between kernels, and the CPU ops running when the longest gaps began
    (innermost and outermost), to see what the device waits for."""
    dev = torch.autograd.DeviceType.CUDA
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == dev)
    if not spans:
        return {"idle_us": None, "gaps": []}
    merged = [list(spans[0])]
    for lo, hi in spans[1:]:
        if lo <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], hi)
        else:
            merged.append([lo, hi])
    gaps = [(b[0] - a[1], a[1]) for a, b in zip(merged, merged[1:], strict=False)]
    cpu = [e for e in prof.events() if e.device_type != dev]
    top = []
    for length, at in sorted(gaps, reverse=True)[:15]:
        if length < min_us:
            break
        live = sorted((e.time_range.end - e.time_range.start, e.name) for e in cpu
                      if e.time_range.start <= at <= e.time_range.end)
        top.append({"us": round(length), "inner": [n for _, n in live[:3]],
                    "outer": [n for _, n in live[-2:]]})
    return {"busy_us": sum(hi - lo for lo, hi in merged),
            "span_us": merged[-1][1] - merged[0][0],
            "idle_us": sum(g for g, _ in gaps), "idle_gaps_over_200us": sum(
                g for g, _ in gaps if g >= min_us), "gaps": top}


def report(opts, prof, wall: float, tokens: int, cuda: bool, plain_s: float) -> None:
    events = [e for e in prof.key_averages()
              if (e.device_time_total if cuda else e.self_cpu_time_total) > 0]
    key = "device_time_total" if cuda else "self_cpu_time_total"
    per_family: dict[str, float] = defaultdict(float)
    kernels = []
    for e in events:
        us = getattr(e, key)
        if cuda and e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        per_family[family(e.key)] += us
        kernels.append((us, e.count, e.key[:110]))
    kernels.sort(reverse=True)
    total = sum(per_family.values()) or 1.0
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    result = {"settings": {k: v for k, v in vars(opts).items() if k not in ("out", "work")},
              "device": torch.cuda.get_device_name(0) if cuda else "cpu",
              "profiled_steps": opts.steps, "wall_s": wall,
              "tokens_per_s_profiled": tokens / wall, "tokens_per_s": tokens / plain_s,
              "peak_alloc_gb": torch.cuda.max_memory_allocated() / 1e9 if cuda else None,
              "share": {k: v / total for k, v in sorted(per_family.items())},
              "top": [{"us": us, "calls": n, "kernel": name} for us, n, name in kernels[:40]],
              "idle": idle_gaps(prof) if cuda else None}
    (out / "profile.json").write_text(json.dumps(result, indent=1))
    lines = [f"# Step profile ({result['device']})", "", f"settings: {result['settings']}",
             f"tokens/s {result['tokens_per_s']:,.0f} (under the profiler: "
             f"{result['tokens_per_s_profiled']:,.0f}); peak "
             f"allocated {result['peak_alloc_gb']} GB", "", "| family | share |", "|---|---:|"]
    lines += [f"| {k} | {v:.1%} |" for k, v in result["share"].items()]
    lines += ["", "| kernel | calls | ms |", "|---|---:|---:|"]
    lines += [f"| `{name}` | {n} | {us / 1e3:.1f} |" for us, n, name in kernels[:40]]
    if result["idle"]:
        idle = result["idle"]
        lines += ["", f"GPU busy {idle['busy_us'] / 1e3:.0f} ms of {idle['span_us'] / 1e3:.0f} ms; "
                  f"idle {idle['idle_us'] / 1e3:.0f} ms ({idle['idle_gaps_over_200us'] / 1e3:.0f} "
                  "ms in gaps over 0.2 ms). Longest gaps:", ""]
        lines += [f"- {g['us'] / 1e3:.1f} ms: inner {g['inner']}, outer {g['outer']}"
                  for g in idle["gaps"]]
    (out / "profile.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:12 + len(result["share"])] + lines[-17:]))


if __name__ == "__main__":
    raise SystemExit(main())
