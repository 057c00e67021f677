"""Time one compiled loss chunk (kernels/linear_ce.plain_chunk) on a GPU: logits [rows, V]
bf16 -> summed cross-entropy and d loss / d logits, compiled with every dimension dynamic
and with the vocabulary static (rows dynamic), against eager.

    python bench/loss_chunk.py [--rows 512] [--vocab 152064] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from tunesmith.kernels.linear_ce import plain_chunk


def timed(fn, logits, targets, reps: int = 20) -> float:
    for _ in range(3):
        fn(logits, targets)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn(logits, targets)
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e3


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--vocab", type=int, default=152064)
    ap.add_argument("--out", default="loss-chunk-out")
    opts = ap.parse_args(argv)
    g = torch.Generator("cuda").manual_seed(0)
    logits = torch.randn(opts.rows, opts.vocab, device="cuda", generator=g).bfloat16()
    targets = torch.randint(0, opts.vocab, (opts.rows,), device="cuda", generator=g)
    short = (logits[: opts.rows // 3], targets[: opts.rows // 3])

    def static_vocab(fn):
        def run(x, t):
            torch._dynamo.maybe_mark_dynamic(x, 0)
            torch._dynamo.maybe_mark_dynamic(t, 0)
            return fn(x, t)
        return run

    variants = {"eager": plain_chunk,
                "all_dynamic": torch.compile(plain_chunk, dynamic=True),
                "static_vocab": static_vocab(torch.compile(plain_chunk))}
    result = {"rows": opts.rows, "vocab": opts.vocab, "device": torch.cuda.get_device_name(),
              "ms": {}, "ideal_ms": 3 * logits.numel() * 2 / 4.8e12 * 1e3}
    for name, fn in variants.items():
        fn(*short)  # a second row count first, as a training run meets them
        result["ms"][name] = timed(fn, logits, targets)
    ref = plain_chunk(logits, targets)
    for name in ("all_dynamic", "static_vocab"):
        got = variants[name](logits, targets)
        torch.testing.assert_close(got[0], ref[0], rtol=1e-4, atol=1e-2)
        torch.testing.assert_close(got[1].float(), ref[1].float(), rtol=2e-2, atol=1e-3)
    out = Path(opts.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "loss_chunk.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
