"""`tunesmith bench`: run the benchmark groups (one process each) and write JSON + a table."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tunesmith.benchmarks.training import PEAK_FLOPS, run_group

GROUPS = ("main", "full", "liger")


def main_group(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tunesmith bench --group")
    p.add_argument("--group", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tiny", action="store_true")
    p.add_argument("--only", default=None)
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    run_group(a.group, out, a.warmup, a.steps, a.tiny, a.only)
    return 0


def run_all(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="tunesmith bench",
                                description="GPU training benchmark (see docs/benchmarks)")
    p.add_argument("--groups", default=",".join(GROUPS))
    p.add_argument("--out", default="docs/benchmarks")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--tiny", action="store_true", help="tiny model: checks the script runs")
    p.add_argument("--only", default=None)
    a = p.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for group in a.groups.split(","):
        cmd = [sys.executable, "-m", "tunesmith.benchmarks.report", "--group", group,
               "--out", str(out), "--warmup", str(a.warmup), "--steps", str(a.steps)]
        cmd += ["--tiny"] * a.tiny + (["--only", a.only] if a.only else [])
        t0 = time.time()
        code = subprocess.call(cmd, env=_env_with_src())
        print(f"group {group}: exit {code} in {time.time() - t0:.0f} s", flush=True)
    write_table(out, " ".join(["tunesmith bench"] + argv))
    return 0


def _env_with_src() -> dict[str, str]:
    import tunesmith

    src = str(Path(tunesmith.__file__).resolve().parents[1])
    env = os.environ.copy()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    return env


def load_results(out: Path) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for group in GROUPS:
        path = out / f"gpu_train_{group}.json"
        if path.is_file():
            rows += json.loads(path.read_text())
    return rows


def write_table(out: Path, command: str) -> Path:
    from tunesmith.benchmarks.systems import describe_environment

    rows = load_results(out)
    env = describe_environment()
    lines = ["# GPU training benchmark\n", f"- command: `{command}`",
             f"- machine: {env.get('gpu', 'no GPU')} x{env.get('gpu_count', 0)}; torch "
             f"{env['torch']}, transformers {env['transformers']}, peft {env.get('peft')}, "
             f"liger-kernel {env['liger_kernel']}",
             f"- MFU against {PEAK_FLOPS / 1e12:.0f} TFLOP/s; FLOPs per sequence of length s: "
             "LoRA (frozen base) 4·N·s, full 6·N·s, plus causal attention 6·L·d·s² "
             "(N: parameters in matrix multiplies incl. the output head; recompute not credited)",
             "", "| workload | system | checkpointing | compile | packed | liger | trained tok/s "
             "| MFU | peak alloc GB | peak reserved GB | padding | loss | note |",
             "|---|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        c = r["case"]
        note = r["error"] or (f"seq {c['seq_len']}" if c["workload"] == "long" else "")
        lines.append(
            f"| {c['workload']} | {c['system']} | {c['checkpointing']} | {int(c['compile'])} | "
            f"{int(c['packed'])} | {int(c['liger'])} | {r['tokens_per_s']:,.0f} | "
            f"{r['mfu']:.1%} | {r['peak_alloc_gb']:.1f} | {r['peak_reserved_gb']:.1f} | "
            f"{r['padding_share']:.0%} | {r['final_loss']:.4f} | {note} |")
    (out / "gpu_train.json").write_text(json.dumps({"command": command, "environment": env,
                                                    "results": rows}, indent=1))
    path = out / "gpu_train.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return path


if __name__ == "__main__":
    raise SystemExit(main_group(sys.argv[1:]))
