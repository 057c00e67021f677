"""Long-context benchmark: LoRA on single rows of L tokens through `tunesmith train <yaml>`
(each length its own process, as a user runs it), escalating L until one fails.

    build (once)   Qwen2.5-7B-shaped random model + byte-level BPE tokenizer (e2e_assets)
    per length L   rows of exactly L tokens after the chat template (template overhead
                   measured once with `tunesmith data inspect`; answers made of words that
                   are one token each), cutoff_len L, micro-batch 1, LoRA r16/alpha32 on all
                   projections, gradient_checkpointing: offload, bf16, 1 warm-up + N steps
    read back      run_summary.json: steady tokens/s, MFU, peak allocated GB, s/step; its data
                   report proves every row arrived whole (L tokens, nothing cut or dropped);
                   its FLOPs per step must equal 4 N L + 6 layers d L^2 (the s^2 term)
    stop           after the first failure (OOM is a status with its message) or the budget

Writes long_context.json and long_context.md (with a paper estimate) to --out.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tunesmith.benchmarks.long_context_estimate import (
    estimate_lines,
    figure,
    lora_step_flops,
    paper_estimate,
    shape_dims,
)
from tunesmith.benchmarks.workloads import SHAPES
from tunesmith.errors import DataError

DEFAULT_LENGTHS = "32768,65536,131072"
TINY_LENGTHS = "512,1024"
INSTRUCTION = "Repeat the following words."
FIRST_WORD = "Words:"  # the answer's first word: its tokens are part of the fixed overhead
PROBE_WORDS = 64


def train_keys(model_dir: Path, data_dir: Path, length: int, steps: int, out: Path,
               tiny: bool) -> dict[str, Any]:
    """The YAML a user writes for this run (plus --set keys, added by the caller)."""
    return {"model_name_or_path": str(model_dir), "stage": "sft", "do_train": True,
            "finetuning_type": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_target": "all",
            "dataset": "long", "dataset_dir": str(data_dir), "template": "qwen",
            "cutoff_len": length, "per_device_train_batch_size": 1,
            "gradient_accumulation_steps": 1, "gradient_checkpointing": "offload",
            "learning_rate": 1e-4, "lr_scheduler_type": "constant", "max_steps": steps,
            "logging_steps": 1, "bf16": not tiny, "output_dir": str(out), "save_steps": 0,
            "overwrite_output_dir": True, "plot_loss": False, "seed": 42}


def single_token_words(tokenizer: Any, limit: int = 2000) -> list[str]:
    """Vocabulary words that encode as exactly one token after a space, so n more words
    are n more tokens."""
    candidates = sorted(t[1:] for t in tokenizer.get_vocab() if re.fullmatch(r"Ġ[a-z]{3,}", t))
    ids = tokenizer([" " + w for w in candidates[:4 * limit]], add_special_tokens=False)
    words = [w for w, i in zip(candidates, ids["input_ids"], strict=False) if len(i) == 1]
    if len(words) < 100:
        raise DataError(f"the benchmark tokenizer has only {len(words)} words that are one "
                        "token after a space (100 needed to build rows of exact length); "
                        "it must be the byte-level BPE of benchmarks/e2e_assets.py")
    return words[:limit]


def write_rows(folder: Path, words: list[str], n_words: int, rows: int, seed: int) -> Path:
    """An alpaca file `long.json` of `rows` rows with answers of `n_words` random words."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    vocab = np.array(words)
    data = [{"instruction": INSTRUCTION, "input": "",
             "output": FIRST_WORD + " " + " ".join(rng.choice(vocab, size=n_words))}
            for _ in range(rows)]
    (folder / "long.json").write_text(json.dumps(data))
    (folder / "dataset_info.json").write_text(json.dumps({"long": {"file_name": "long.json"}}))
    return folder


def template_overhead(work: Path, model_dir: Path, words: list[str], env: dict[str, str]
                      ) -> int:
    """Tokens of a row beyond its answer words, measured by `tunesmith data inspect` on a
    short row (the same template, instruction and first word as the long rows)."""
    data = write_rows(work / "probe-data", words, PROBE_WORDS, 1, seed=0)
    path = work / "probe.yaml"
    keys = train_keys(model_dir, data, 4 * PROBE_WORDS + 512, 1, work / "probe-out", True)
    path.write_text(yaml.safe_dump(keys, sort_keys=False))
    cmd = [sys.executable, "-m", "tunesmith", "data", "inspect", str(path), "--color", "never"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    found = re.search(r"^\s*length_max\s+(\d+)\s*$", proc.stdout, re.MULTILINE)
    if proc.returncode or not found:
        raise DataError(f"measuring the template overhead: `{' '.join(cmd)}` failed (exit "
                        f"{proc.returncode}) or printed no length_max: "
                        f"{(proc.stderr or proc.stdout)[-2000:]}")
    return int(found.group(1)) - PROBE_WORDS


def run_status(returncode: int | None, log_text: str, cap_s: float) -> tuple[str, str]:
    """(status, message) of a finished `tunesmith train` process from its exit and log."""
    if returncode is None:
        return f"timeout after {cap_s:.0f} s", ""
    if returncode == 0:
        return "ok", ""
    lines = [ln.strip() for ln in log_text.splitlines() if ln.strip()]
    oom = [ln for ln in lines if re.search(r"out of memory|OutOfMemoryError", ln, re.I)]
    if oom:
        return "OOM", oom[-1][:600]
    if returncode < 0:
        return f"killed by signal {-returncode}", (lines[-1][:600] if lines else "")
    return f"exit {returncode}", (lines[-1][:600] if lines else "")


def train_once(yaml_path: Path, log_path: Path, env: dict[str, str], cap_s: float
               ) -> tuple[str, str]:
    cmd = [sys.executable, "-m", "tunesmith", "train", str(yaml_path)]
    with open(log_path, "w") as log:
        try:
            rc: int | None = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                            timeout=cap_s, check=False).returncode
        except subprocess.TimeoutExpired:
            rc = None
    return run_status(rc, log_path.read_text(errors="replace"), cap_s)


def sample_check(summary: dict[str, Any], length: int, rows: int, steps: int) -> str:
    """"ok" when the run's data report shows every row whole at `length` tokens and every
    step trained one of them; else what differs."""
    d, p = summary.get("data", {}), summary.get("performance", {})
    want = {"rows": rows, "samples": rows, "truncated_prompt": 0, "truncated_response": 0,
            "dropped_too_long": 0, "total_tokens": rows * length}
    for key, value in want.items():
        if d.get(key) != value:
            return f"data report {key} = {d.get(key)}, expected {value}"
    if p.get("tokens") != steps * length:
        return f"trained {p.get('tokens')} tokens in {steps} steps, expected {steps * length}"
    return "ok"


def flops_check(summary: dict[str, Any], cfg: dict[str, Any], length: int) -> dict[str, Any]:
    """The run's FLOPs per step against 4 N L + 6 layers d L^2 for one L-long row."""
    p = summary.get("performance", {})
    rate, tflops = p.get("steady_tokens_per_s"), p.get("steady_tflops")
    expected = lora_step_flops(shape_dims(cfg), length)
    if not rate or tflops is None:
        return {"flops_check": "no steady-state figures", "flops_expected": expected}
    reported = tflops * 1e12 / rate * length
    ok = abs(reported - expected) <= 1e-3 * expected
    return {"flops_per_step": reported, "flops_expected": expected,
            "flops_check": "ok (L^2 attention term counted)" if ok
            else f"mismatch: reported {reported:.4e}, expected {expected:.4e}"}


def read_run(out: Path, cfg: dict[str, Any], length: int, rows: int, steps: int
             ) -> dict[str, Any]:
    """Figures of a finished run from its run_summary.json."""
    s = json.loads((out / "run_summary.json").read_text())
    p, sp = s["performance"], s.get("speed", {})
    steady = p.get("steady_steps") or 0
    rec = {"tokens_per_s": p.get("steady_tokens_per_s"), "mfu": p.get("steady_mfu"),
           "peak_alloc_gb": p.get("peak_memory_gb"), "peak_reserved_gb": p.get("peak_reserved_gb"),
           "s_per_step": (length * steady / p["steady_tokens_per_s"]
                          if steady and p.get("steady_tokens_per_s") else None),
           "steady_steps": steady, "warmup_steps": p.get("warmup_steps"),
           "first_step_s": p.get("first_step_s"), "attention": sp.get("attention"),
           "compile": sp.get("compile"), "compile_fallback": sp.get("compile_fallback"),
           "checkpointing": sp.get("checkpointing"),
           "offloaded_gb_per_step": (sp.get("offloaded_mb") or 0) / 1e3 / max(s["steps"], 1),
           "sample_check": sample_check(s, length, rows, steps), "data": s.get("data")}
    rec.update(flops_check(s, cfg, length))
    return rec


def run_length(length: int, opts: Any, model_dir: Path, words: list[str], overhead: int,
               env: dict[str, str], cap_s: float) -> dict[str, Any]:
    """One `tunesmith train` run on rows of exactly `length` tokens."""
    work = Path(opts.work) / "longctx"
    started = time.perf_counter()
    n_words = length - overhead
    data = write_rows(work / f"data-{length}", words, n_words, opts.steps, seed=length)
    out = work / f"run-{length}"
    keys = {**train_keys(model_dir, data, length, opts.steps, out, opts.tiny), **opts.set}
    path = work / f"run-{length}.yaml"
    path.write_text(yaml.safe_dump(keys, sort_keys=False))
    log = work / f"run-{length}.log"
    status, message = train_once(path, log, env, cap_s)
    keep_log_tail(log, Path(opts.out) / f"long_context-{length}.log")
    rec: dict[str, Any] = {"length": length, "status": status, "message": message,
                           "yaml": keys}
    if status == "ok":
        cfg = json.loads((model_dir / "config.json").read_text())
        rec.update(read_run(out, cfg, length, opts.steps, opts.steps))
        if rec["sample_check"] != "ok":
            rec["status"] = f"bad rows: {rec['sample_check']}"
    rec["wall_s"] = time.perf_counter() - started
    return rec


def keep_log_tail(log: Path, dest: Path, lines: int = 300) -> None:
    """The last lines of a run's log beside the report (the work folder stays behind on
    the machine that ran it)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    text = log.read_text(errors="replace").splitlines()[-lines:] if log.is_file() else []
    dest.write_text("\n".join(text) + "\n")


def escalate(lengths: list[int], run_one: Callable[[int, float], dict[str, Any]],
             budget_s: float, run_cap_s: float, min_run_s: float) -> list[dict[str, Any]]:
    """Run the lengths in order; after a failure or when the budget is spent, the rest are
    recorded as not run (with the reason)."""
    start, results, stop = time.perf_counter(), [], ""
    for length in lengths:
        left = budget_s - (time.perf_counter() - start)
        if not stop and left < min_run_s:
            stop = f"{left:.0f} s of the budget left"
        if stop:
            results.append({"length": length, "status": f"not run: {stop}"})
            continue
        rec = run_one(length, min(run_cap_s, left))
        results.append(rec)
        print(f"[long-context] {length}: {json.dumps(rec, default=str)[:400]}", flush=True)
        if rec["status"] != "ok":
            stop = f"stopped after {length} ({rec['status']})"
    return results


def machine() -> dict[str, Any]:
    import torch
    import transformers

    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    return {"device": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
            "host_ram_gb": round(ram, 1), "cpus": os.cpu_count()}


def _cell(value: Any, fmt: str) -> str:
    return "n/a" if value is None else format(value, fmt)


def write_report(out: Path, report: dict[str, Any]) -> None:
    meta, runs = report["meta"], report["runs"]
    out.mkdir(parents=True, exist_ok=True)
    (out / "long_context.json").write_text(json.dumps(report, indent=2, default=str))
    m = meta["machine"]
    lines = [f"# Long context: LoRA on one row of L tokens ({meta['shape']})", "",
             f"`{meta['command']}`", "",
             f"{m['device']}, torch {m['torch']}, transformers {m['transformers']}, "
             f"{m['host_ram_gb']} GB host RAM; LoRA r16/alpha32 on all projections, "
             "micro-batch 1, gradient_checkpointing: offload, chunked loss; "
             f"{meta['steps']} steps per length (warm-up left out); extra keys: "
             f"{meta['extra_keys'] or 'none'}; wall {meta['wall_s']:.0f} s"
             + ("; peak memory on a CPU is the process RSS." if m["device"] == "cpu" else "."),
             ""]
    lines += [*result_lines(runs), "", *estimate_section(meta["estimates"]), ""]
    (out / "long_context.md").write_text("\n".join(lines))
    print("\n".join(lines))


def result_lines(runs: list[dict[str, Any]]) -> list[str]:
    """The measured table and, per run made, its checks."""
    if not runs:
        return ["No runs (--estimate-only)."]
    lines = ["| length | tok/s | MFU | peak alloc GB | s/step | status |",
             "|---:|---:|---:|---:|---:|---|"]
    for r in runs:
        lines.append(f"| {r['length']:,} | {_cell(r.get('tokens_per_s'), ',.0f')} | "
                     f"{_cell(r.get('mfu'), '.1%')} | {_cell(r.get('peak_alloc_gb'), '.1f')} | "
                     f"{_cell(r.get('s_per_step'), '.2f')} | {r['status']} |")
    lines += ["", "| length | rows whole (data report) | FLOPs per step | offloaded GB/step "
              "| attention | compile | message |", "|---:|---|---|---:|---|---|---|"]
    for r in runs:
        if not r["status"].startswith("not run"):
            lines.append(f"| {r['length']:,} | {r.get('sample_check', 'n/a')} | "
                         f"{r.get('flops_check', 'n/a')} | "
                         f"{_cell(r.get('offloaded_gb_per_step'), '.3f')} | "
                         f"{r.get('attention', 'n/a')} | {r.get('compile', 'n/a')} | "
                         f"{r.get('message') or ''} |")
    return lines


def estimate_section(estimates: list[dict[str, float]]) -> list[str]:
    """The largest length's estimate in full, every length's in one line each."""
    if not estimates:
        return []
    lines = ["## Paper estimate", "", *estimate_lines(estimates[-1]), "",
             "| length | est. GPU GB | est. host GB | est. s/step at 35% MFU |",
             "|---:|---:|---:|---:|"]
    lines += [f"| {e['length']:,} | {figure(e['gpu_total_gb'])} | {figure(e['host_total_gb'])} "
              f"| {figure(e['step_s'])} |" for e in estimates]
    return lines


def build_inputs(opts: Any, shape: str, env: dict[str, str]) -> tuple[Path, list[str], int]:
    """The model folder (shared with bench/e2e.py's work folder), one-token words and the
    template overhead."""
    import torch
    from transformers import AutoTokenizer

    from tunesmith.benchmarks.e2e_assets import build_assets

    device = torch.device("cuda" if torch.cuda.is_available() and not opts.tiny else "cpu")
    assets = build_assets(Path(opts.work), shape, 64, device)
    words = single_token_words(AutoTokenizer.from_pretrained(assets.model_dir))
    overhead = template_overhead(Path(opts.work) / "longctx", assets.model_dir, words, env)
    return assets.model_dir, words, overhead


def run_long_context(opts: Any) -> dict[str, Any]:
    from tunesmith.benchmarks.e2e import ts_env

    start = time.perf_counter()
    shape = "tiny" if opts.tiny else "qwen2.5-7b"
    meta = {"shape": shape, "command": " ".join(["python", *opts.argv]), "machine": machine(),
            "steps": opts.steps, "lengths": opts.lengths, "extra_keys": opts.set,
            "estimates": [paper_estimate(SHAPES[shape], n) for n in opts.lengths]}
    runs: list[dict[str, Any]] = []
    if not opts.estimate_only:
        env = ts_env(Path(opts.work))
        model_dir, words, overhead = build_inputs(opts, shape, env)
        meta["template_overhead_tokens"] = overhead

        def one(length: int, cap_s: float) -> dict[str, Any]:
            return run_length(length, opts, model_dir, words, overhead, env, cap_s)

        left = opts.budget_s - (time.perf_counter() - start)
        runs = escalate(opts.lengths, one, left, opts.run_cap_s, opts.min_run_s)
    meta["wall_s"] = time.perf_counter() - start
    report = {"meta": meta, "runs": runs}
    write_report(Path(opts.out), report)
    return report


def parse_args(argv: list[str]) -> Any:
    import argparse

    ap = argparse.ArgumentParser(prog="bench/long_context.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "long-context-out"),
                    help="where long_context.json and .md go (default $OUT)")
    ap.add_argument("--tiny", action="store_true", help="CPU check: tiny model, short rows")
    ap.add_argument("--work", default="/tmp/tunesmith-e2e",
                    help="model, data and run folders (the model is shared with bench/e2e.py)")
    ap.add_argument("--lengths", default=None,
                    help=f"comma-separated, escalating (default {DEFAULT_LENGTHS}; "
                         f"--tiny {TINY_LENGTHS})")
    ap.add_argument("--steps", type=int, default=3, help="steps per length (1 is warm-up)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="an extra training key for every run (repeatable), e.g. packing=true")
    ap.add_argument("--budget-s", type=float, default=465.0, help="whole benchmark, seconds")
    ap.add_argument("--run-cap-s", type=float, default=330.0, help="one run, seconds")
    ap.add_argument("--min-run-s", type=float, default=30.0,
                    help="stop when less than this is left of the budget")
    ap.add_argument("--estimate-only", action="store_true",
                    help="write the paper estimate only (no model, no runs; any machine)")
    opts = ap.parse_args(argv)
    opts.argv = ["bench/long_context.py", *argv]
    opts.lengths = _lengths(ap, opts)
    if opts.steps < 2:
        ap.error(f"--steps {opts.steps}: at least 2 (one warm-up, one measured)")
    bad = [s for s in opts.set if "=" not in s]
    if bad:
        ap.error(f"--set {bad[0]!r}: expected KEY=VALUE, e.g. packing=true")
    opts.set = {k: yaml.safe_load(v) for k, v in (s.split("=", 1) for s in opts.set)}
    return opts


def _lengths(ap: Any, opts: Any) -> list[int]:
    """--lengths as integers, escalating, within the shape's max_position_embeddings."""
    shape = "tiny" if opts.tiny else "qwen2.5-7b"
    raw = opts.lengths or (TINY_LENGTHS if opts.tiny else DEFAULT_LENGTHS)
    try:
        lengths = [int(x) for x in raw.split(",") if x.strip()]
    except ValueError:
        ap.error(f"--lengths {raw!r}: expected comma-separated integers, e.g. {DEFAULT_LENGTHS}")
    limit = SHAPES[shape]["max_position_embeddings"]
    if any(not 0 < n <= limit for n in lengths) or lengths != sorted(lengths) or not lengths:
        ap.error(f"--lengths {raw!r}: escalating lengths from 1 to the {shape} shape's "
                 f"max_position_embeddings ({limit}) expected")
    return lengths


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(list(sys.argv[1:] if argv is None else argv))
    report = run_long_context(opts)
    return 0 if opts.estimate_only or any(r["status"] == "ok" for r in report["runs"]) else 1
