"""Benchmark: cold preprocessing of 100k alpaca samples, tunesmith vs LLaMA-Factory 0.9.x.

    python bench/data_prep.py [--samples 100000] [--workers 2] [--lf-python /tmp/lfvenv/bin/python]

Synthetic alpaca rows whose token counts follow a log-normal (median 256, clipped to
16..2048), the SmolLM2 tokenizer (resolved through tunesmith's model provisioning, so
$TUNESMITH_CACHE is honoured) and the same template on both sides: LLaMA-Factory's
`smollm2` (tunesmith encodes it token for token as LLaMA-Factory does; with tiktoken
installed through its checked fast byte-level BPE path). Both tokenise with `preprocessing_num_workers` processes and no cache; tunesmith's
cache reload is timed afterwards. LLaMA-Factory runs in its own virtual environment
(`--lf-python`), driven through its dataset functions in a subprocess. Writes
docs/benchmarks/data_prep.json and data_prep.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
LF_DRIVER = r'''
import json, os, resource, sys, time
from llamafactory.hparams import get_train_args
from llamafactory.model import load_tokenizer
from llamafactory.data import get_template_and_fix_tokenizer, get_dataset
args = json.loads(sys.argv[1])
model_args, data_args, training_args, finetuning_args, _ = get_train_args(args)
tokenizer_module = load_tokenizer(model_args)
template = get_template_and_fix_tokenizer(tokenizer_module["tokenizer"], data_args)
def cpu():
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime
load0, cpu0, start = os.getloadavg()[0], cpu(), time.perf_counter()
module = get_dataset(template, model_args, data_args, training_args, "sft", **tokenizer_module)
seconds, cpu_s = time.perf_counter() - start, cpu() - cpu0
train = module["train_dataset"]
tokens = sum(len(x) for x in train["input_ids"])
print("LF_RESULT " + json.dumps({"seconds": seconds, "cpu_s": cpu_s, "samples": len(train),
                                 "tokens": tokens, "load": [load0, os.getloadavg()[0]]}))
'''


def make_rows(tokenizer, n: int, seed: int) -> tuple[list[dict], np.ndarray]:
    """Alpaca rows built from single-token words (so the token count is what we asked),
    drawn with Zipf frequencies like natural text."""
    words = [t for t in tokenizer.get_vocab() if t.startswith("\u0120") and t[1:].isalpha()
             and t[1:].isascii() and len(t) > 3]
    words = [tokenizer.convert_tokens_to_string([w]) for w in sorted(words)]
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.round(rng.lognormal(np.log(256), 0.75, n)), 16, 2048).astype(int)
    # word frequencies follow Zipf's law, as in natural text (rank r has weight 1 / r)
    weights = 1.0 / np.arange(1, len(words) + 1)
    rng.shuffle(words)
    picks = rng.choice(len(words), int(lengths.sum()), p=weights / weights.sum())
    rows, at = [], 0
    for total in lengths.tolist():
        k = max(4, total // 4)
        chunk = [words[i] for i in picks[at:at + total]]
        at += total
        rows.append({"instruction": "".join(chunk[:k]).strip(), "input": "",
                     "output": "".join(chunk[k:]).strip()})
    return rows, lengths


def run_tunesmith(data_dir: Path, workers: int, cutoff: int, tokenizer) -> dict:
    from tunesmith.config.schema import DataConfig
    from tunesmith.data.loading import DataContext, prepare_data
    from tunesmith.data.slot_renderer import make_renderer
    from tunesmith.data.template import load_template_source

    name, source = load_template_source("smollm2", tokenizer)  # the template LF uses
    renderer = make_renderer(name, source, tokenizer)
    cfg = DataConfig(dataset=["synthetic"], dataset_dir=str(data_dir), cutoff_len=cutoff,
                     preprocessing_num_workers=workers)
    # cold: overwrite_cache re-tokenises even if a cache exists
    load0, cpu0, start = os.getloadavg()[0], cpu_seconds(), time.perf_counter()
    data = prepare_data(cfg, DataContext(renderer, tokenizer, 42, "sft", overwrite_cache=True))
    cold, cold_cpu = time.perf_counter() - start, cpu_seconds() - cpu0
    load = [load0, os.getloadavg()[0]]
    assert data.report.cache_misses == 1 and data.report.cache_hits == 0
    ctx = DataContext(renderer, tokenizer, 42, "sft")
    reloads = []
    for _ in range(3):
        start = time.perf_counter()
        again = prepare_data(cfg, ctx)
        _ = again.train[len(again.train) - 1]  # touch the data
        reloads.append(time.perf_counter() - start)
    assert again.report.cache_hits == 1 and len(again.train) == len(data.train)
    s = data.report.summary()
    return {"cold_s": cold, "cpu_s": cold_cpu, "load": load, "reload_s": min(reloads),
            "samples": len(data.train),
            "tokens": s["total_tokens"], "truncated": s["truncated_prompt"]
            + s["truncated_response"]}


def cpu_seconds() -> float:
    """CPU time (user + system) of this process and its finished children."""
    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def run_llamafactory(lf_python: str, data_dir: Path, model_dir: str, workers: int, cutoff: int,
                     out_dir: Path) -> dict:
    args = {"model_name_or_path": model_dir, "stage": "sft", "do_train": True,
            "finetuning_type": "lora", "dataset": "synthetic", "dataset_dir": str(data_dir),
            "template": "smollm2", "cutoff_len": cutoff, "overwrite_cache": True,
            "preprocessing_num_workers": workers, "output_dir": str(out_dir),
            "report_to": "none", "overwrite_output_dir": True}
    env = {**os.environ, "HF_DATASETS_CACHE": str(out_dir / "hf_cache"), "HF_HUB_OFFLINE": "1",
           "DISABLE_VERSION_CHECK": "1"}
    proc = subprocess.run([lf_python, "-c", LF_DRIVER, json.dumps(args)], env=env,
                          capture_output=True, text=True)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("LF_RESULT ")), None)
    if proc.returncode or line is None:
        raise SystemExit(f"LLaMA-Factory run failed:\n{proc.stderr[-4000:]}")
    return json.loads(line.removeprefix("LF_RESULT "))


def write_report(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "data_prep.json").write_text(json.dumps(result, indent=2) + "\n")
    ts, lf = result["tunesmith"], result["llamafactory"]
    md = [
        "# Data preprocessing: tunesmith vs LLaMA-Factory",
        "",
        f"Command: `{result['command']}`  ",
        f"Machine: {result['machine']}  ",
        f"Data: {result['samples']} synthetic alpaca samples, token counts log-normal "
        f"(median {result['median_tokens']}, clipped 16..2048), SmolLM2 tokenizer, template smollm2 on both sides, "
        f"cutoff_len {result['cutoff_len']}, {result['workers']} preprocessing workers.",
        "",
        "| | cold preprocessing, wall (s) | CPU time (s) | samples | tokens | load avg "
        "(start, end) |",
        "|---|---:|---:|---:|---:|---|",
        f"| LLaMA-Factory {lf.get('version', '0.9.x')} | {lf['seconds']:.1f} | "
        f"{lf['cpu_s']:.1f} | {lf['samples']} | {lf['tokens']} | "
        f"{lf['load'][0]:.1f}, {lf['load'][1]:.1f} |",
        f"| tunesmith | {ts['cold_s']:.1f} | {ts['cpu_s']:.1f} | {ts['samples']} | "
        f"{ts['tokens']} | {ts['load'][0]:.1f}, {ts['load'][1]:.1f} |",
        "",
        f"**Speed-up (wall clock): {result['speedup']:.2f}x; in CPU time: "
        f"{result['cpu_speedup']:.2f}x.** tunesmith cache reload of the same "
        f"{ts['samples']} samples: **{ts['reload_s'] * 1000:.0f} ms**.",
        "",
        "CPU time is user + system time of all processes of each side (workers included); "
        "it does not depend on what else the machine runs, whereas wall time does when the "
        "machine is shared (see the load averages). Token totals: " + result["token_note"],
        "",
        "tunesmith's gain: its own exact byte-level BPE path (tiktoken built from the "
        "tokenizer's merges, checked against the tokenizer on the data), per-turn pieces "
        "tokenised in one batched call per 1000 rows, no Arrow round trips, one tokenizer "
        "thread per worker.",
        "",
    ]
    (out / "data_prep.md").write_text("\n".join(md))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--cutoff-len", type=int, default=2048)
    p.add_argument("--lf-python", default="/work/side/lf/bin/python")
    p.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    ns = p.parse_args()
    from tunesmith.models.loader import load_tokenizer
    from tunesmith.models.provision import resolve_model_path

    model_dir = resolve_model_path("smollm2-135m-instruct")
    tokenizer = load_tokenizer(model_dir)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        rows, lengths = make_rows(tokenizer, ns.samples, seed=0)
        data_dir = work / "data"
        data_dir.mkdir()
        (data_dir / "synthetic.json").write_text(json.dumps(rows, ensure_ascii=False))
        (data_dir / "dataset_info.json").write_text(json.dumps(
            {"synthetic": {"file_name": "synthetic.json"}}))
        del rows
        lf = run_llamafactory(ns.lf_python, data_dir, model_dir, ns.workers, ns.cutoff_len,
                              work / "lf")
        lf["version"] = subprocess.run([ns.lf_python, "-c", "import llamafactory; print("
                                        "llamafactory.__version__)"], capture_output=True,
                                       text=True).stdout.strip()
        ts = run_tunesmith(data_dir, ns.workers, ns.cutoff_len, tokenizer)
    result = {"command": "python " + " ".join(sys.argv), "machine": _machine(),
              "samples": ns.samples, "median_tokens": int(np.median(lengths)),
              "cutoff_len": ns.cutoff_len, "workers": ns.workers, "tunesmith": ts,
              "llamafactory": lf, "speedup": lf["seconds"] / ts["cold_s"],
              "cpu_speedup": lf["cpu_s"] / ts["cpu_s"], "token_note": token_note(lf, ts)}
    write_report(result, Path(ns.out))
    print(json.dumps(result, indent=2))


def token_note(lf: dict, ts: dict) -> str:
    if lf["tokens"] == ts["tokens"]:
        return (f"identical ({ts['tokens']}): both encode LLaMA-Factory's smollm2 template. "
                "(Before tunesmith encoded LLaMA-Factory templates, it rendered SmolLM2's own "
                "chat template, whose default system prompt lacks the final '.' of "
                "LLaMA-Factory's smollm2 default system: one token per sample, minus the "
                "samples both sides cut to cutoff_len.)")
    return f"they differ by {lf['tokens'] - ts['tokens']} (LLaMA-Factory minus tunesmith)."


def _machine() -> str:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in
                     Path("/proc/cpuinfo").read_text().splitlines() if "model name" in line)
        cpu = model
    except (OSError, StopIteration):
        pass
    return f"{cpu}, {cores} cores, Python {platform.python_version()}, {platform.system()}"


if __name__ == "__main__":
    main()
