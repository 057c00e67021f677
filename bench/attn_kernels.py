"""Which attention kernel is fastest for a training step's shapes: forward and forward +
backward of causal attention at Qwen2.5-7B's heads (28 query, 4 key/value, dim 128), bf16.

    python bench/attn_kernels.py --out $OUT/attn        (one H200, about 1 minute)

Cases: dense rows (4 x 2048, is_causal) and packed rows (8,192 tokens of alpaca-like
segments, varlen). Kernels: SDPA's flash, cuDNN and memory-efficient backends (K/V grouped
where the backend takes it, else expanded), torch's varlen FlashAttention and FlexAttention
(compiled, causal / document mask). Each result carries its error against an fp32 reference
(output and the three gradients, relative Frobenius norm). Writes attn.json and attn.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HEADS, KV_HEADS, DIM = 28, 4, 128


def timed(fn: Callable[[], Any], reps: int) -> float:
    """Median milliseconds of `fn` over `reps` runs after 3 warm-up runs (CUDA events)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def segments(total: int, mean: float, seed: int) -> list[int]:
    """Log-normal segment lengths (alpaca-like) filling `total` tokens."""
    gen = torch.Generator().manual_seed(seed)
    out: list[int] = []
    while sum(out) < total:
        n = int(torch.empty(1).log_normal_(mean=5.6, std=0.7, generator=gen).clamp(16, 2048))
        out.append(min(n, total - sum(out)))
    return out


def causal_flops(lengths: list[int], heads: int = HEADS, dim: int = DIM) -> float:
    """Forward FLOPs of causal attention (two matmuls, half the square)."""
    return sum(4 * heads * dim * n * (n + 1) / 2 for n in lengths)


def _backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]


def _offsets(lengths: list[int], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """Segment boundaries [0, l0, l0 + l1, ...]."""
    return torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=dtype,
                        device=device)


def sdpa_kernel(backend: str, gqa: bool) -> Callable:
    from torch.nn.attention import sdpa_kernel as ctx

    which = _backend(backend)

    def run(q, k, v, _lengths):  # [B, H, T, D]
        if not gqa:
            k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
        with ctx([which]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
    return run


def varlen_kernel() -> Callable:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    from tunesmith.kernels.attention import _flash_varlen, native_gqa

    native_gqa()

    def flat(t):  # [B, H, T, D] -> [B*T, H, D]
        return t.transpose(1, 2).reshape(-1, t.shape[1], t.shape[3])

    def run(q, k, v, lengths):
        cu = _offsets(lengths, torch.int32, q.device)
        out = _flash_varlen(flat(q), flat(k), flat(v), cu, max(lengths), None)
        b, h, t, d = q.shape
        return out.reshape(b, t, h, d).transpose(1, 2)
    return run


def njt_kernel(backend: str) -> Callable:
    """SDPA over a nested jagged tensor (one component per segment) under one backend; K/V
    expanded (grouped K/V is not taken for nested inputs)."""
    from torch.nn.attention import sdpa_kernel as ctx

    which = _backend(backend)

    def run(q, k, v, lengths):  # [1, H, N, D]
        offsets = _offsets(lengths, torch.int64, q.device)

        def nest(t):  # [1, H, N, D] -> nested [S, H, j, D]
            t = t.repeat_interleave(q.shape[1] // t.shape[1], dim=1)[0].transpose(0, 1).contiguous()
            return torch.nested.nested_tensor_from_jagged(t, offsets).transpose(1, 2)
        with ctx([which]):
            out = F.scaled_dot_product_attention(nest(q), nest(k), nest(v), is_causal=True)
        return out.transpose(1, 2).values().transpose(0, 1)[None]
    return run


def flex_kernel(lengths: list[int], n: int, device: str) -> Callable:
    """Causal FlexAttention; with several segments in one row, a document mask too."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    doc = torch.repeat_interleave(torch.arange(len(lengths), device=device),
                                  torch.tensor(lengths, device=device))

    def causal(b, h, qi, ki):
        return qi >= ki

    def document(b, h, qi, ki):
        return (qi >= ki) & (doc[qi] == doc[ki])
    if len(set(lengths)) == 1 and lengths[0] < n:  # dense rows: one sequence per row
        block = create_block_mask(causal, None, None, lengths[0], lengths[0], device=device)
    else:
        block = create_block_mask(document, None, None, n, n, device=device)
    compiled = torch.compile(flex_attention, dynamic=False)

    def run(q, k, v, _lengths):
        return compiled(q, k, v, block_mask=block, enable_gqa=True)
    return run


def reference(q, k, v, lengths):
    """fp32 math SDPA per segment (rows of a batch are segments of equal length)."""
    q, k, v = (t.detach().float().requires_grad_() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    kk, vv = (t.repeat_interleave(groups, dim=1) for t in (k, v))
    outs, lo = [], 0
    if q.shape[0] > 1:
        out = F.scaled_dot_product_attention(q, kk, vv, is_causal=True)
    else:
        for n in lengths:
            outs.append(F.scaled_dot_product_attention(q[:, :, lo:lo + n], kk[:, :, lo:lo + n],
                                                       vv[:, :, lo:lo + n], is_causal=True))
            lo += n
        out = torch.cat(outs, dim=2)
    return out, q, k, v


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-30))


def measure(name: str, fn: Callable, case: dict[str, Any], reps: int) -> dict[str, Any]:
    q, k, v, go, lengths = case["q"], case["k"], case["v"], case["grad"], case["lengths"]
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    row: dict[str, Any] = {"kernel": name}
    try:
        out = fn(*leaves, lengths)
        out.backward(go)
        ref = case["ref"]
        row["err"] = {"out": rel(out, ref["out"]), **{f"d{n}": rel(t.grad, ref[f"d{n}"])
                      for n, t in zip("qkv", leaves, strict=True)}}
        with torch.no_grad():
            fwd = timed(lambda: fn(*leaves, lengths), reps)

        def step():
            for t in leaves:
                t.grad = None
            fn(*leaves, lengths).backward(go)
        both = timed(step, reps)
    except Exception as exc:  # noqa: BLE001 - a kernel that cannot run is a result
        row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
        return row
    flops = causal_flops(lengths)
    row.update(fwd_ms=fwd, fwd_bwd_ms=both, bwd_ms=both - fwd,
               fwd_tflops=flops / fwd / 1e9, bwd_tflops=2.5 * flops / max(both - fwd, 1e-6) / 1e9,
               total_tflops=3.5 * flops / both / 1e9)
    return row


def build_case(kind: str, tokens: int, device: str, dtype: torch.dtype) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(0)
    if kind == "dense":
        b, t, lengths = tokens // 2048, 2048, [2048] * (tokens // 2048)
    else:
        b, t, lengths = 1, tokens, segments(tokens, 353, seed=1)
    q, k, v, go = (torch.randn(b, heads, t, DIM, device=device, dtype=dtype, generator=gen)
                   for heads in (HEADS, KV_HEADS, KV_HEADS, HEADS))
    out, rq, rk, rv = reference(q, k, v, lengths)
    out.backward(go.float())
    ref = {"out": out.detach(), "dq": rq.grad, "dk": rk.grad, "dv": rv.grad}
    return {"q": q, "k": k, "v": v, "grad": go, "lengths": lengths, "ref": ref}


def kernels_for(kind: str, lengths: list[int], n: int, device: str) -> dict[str, Callable]:
    out: dict[str, Callable] = {}
    if kind == "dense":
        for backend in ("flash", "cudnn", "efficient"):
            out[f"sdpa_{backend}_gqa"] = sdpa_kernel(backend, gqa=True)
            out[f"sdpa_{backend}_expanded"] = sdpa_kernel(backend, gqa=False)
    out["varlen_flash"] = varlen_kernel()
    if kind == "packed":
        out["njt_cudnn"] = njt_kernel("cudnn")
        out["njt_flash"] = njt_kernel("flash")
    try:
        out["flex"] = flex_kernel(lengths, n, device)
    except Exception as exc:  # noqa: BLE001
        print(f"flex unavailable: {exc}")
    return out


def first_call_cost(lengths: list[int], device: str = "cuda") -> list[dict[str, Any]]:
    """Forward + backward of one 1 x T row for each new T, twice over: the first pass holds
    whatever a kernel builds per shape (cuDNN builds and caches an execution plan per
    shape), the second pass only the run."""
    kernels = {"cudnn": sdpa_kernel("cudnn", gqa=True), "sdpa_flash": sdpa_kernel("flash", gqa=True)}
    rows = []
    for name, fn in kernels.items():
        passes = []
        for _ in range(2):
            torch.cuda.synchronize()
            start = time.perf_counter()
            for t in lengths:
                q, k, v = (torch.randn(1, h, t, DIM, device=device, dtype=torch.bfloat16,
                                       requires_grad=True) for h in (HEADS, KV_HEADS, KV_HEADS))
                fn(q, k, v, [t]).sum().backward()
            torch.cuda.synchronize()
            passes.append((time.perf_counter() - start) * 1e3 / len(lengths))
        rows.append({"kernel": name, "first_ms_per_shape": passes[0], "again_ms": passes[1]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    opts = ap.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA GPU: nothing to time")
        return 0
    out_dir = Path(opts.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version(), "date": time.strftime("%Y-%m-%d")}
    rows = []
    for kind in ("dense", "packed"):
        case = build_case(kind, opts.tokens, "cuda", torch.bfloat16)
        for name, fn in kernels_for(kind, case["lengths"], opts.tokens, "cuda").items():
            row = {"case": kind, **measure(name, fn, case, opts.reps)}
            rows.append(row)
            print(json.dumps(row), flush=True)
        del case
        torch.cuda.empty_cache()
    shapes = first_call_cost(list(range(900, 940)))
    (out_dir / "attn.json").write_text(json.dumps({"meta": meta, "rows": rows,
                                                   "new_shape_cost": shapes}, indent=1))
    lines = [f"# Attention kernels ({meta['gpu']}, torch {meta['torch']}, cuDNN {meta['cudnn']})",
             "", "| case | kernel | fwd ms | fwd+bwd ms | fwd TFLOP/s | bwd TFLOP/s | max rel err |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | {r['kernel']} | {r['error']} | | | | |")
            continue
        lines.append(f"| {r['case']} | {r['kernel']} | {r['fwd_ms']:.3f} | {r['fwd_bwd_ms']:.3f} "
                     f"| {r['fwd_tflops']:.0f} | {r['bwd_tflops']:.0f} "
                     f"| {max(r['err'].values()):.1e} |")
    lines += ["", "New row lengths (40 of them, 900..939 tokens, 1 x T, forward + backward):", "",
              "| kernel | first call per length, ms | again, ms |", "|---|---:|---:|"]
    lines += [f"| {r['kernel']} | {r['first_ms_per_shape']:.1f} | {r['again_ms']:.2f} |"
              for r in shapes]
    (out_dir / "attn.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
