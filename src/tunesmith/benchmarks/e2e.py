"""End-to-end benchmark: `tunesmith train <yaml>` against `llamafactory-cli train <yaml>`
on the same model, file and keys, each as its own process (what a user runs).

    cases        tunesmith                           LLaMA-Factory 0.9.5
    natural      packing, bf16 (no speed key)        the same YAML (its default: recompute)
    best         the natural run (auto = tuned)      + liger, neat_packing, no recompute
    recompute    + gradient_checkpointing: true      + liger, neat_packing (recompute)
    dense        2048-token rows, no speed key       + liger, no recompute
    cached       the natural run again (its compile warm-up from the cache), tunesmith only

Figures: steady-state non-pad tokens/s (warm-up steps left out), peak allocated GB, MFU
(tunesmith's FLOP model, the same FLOPs per token for both: same samples); `ratio` =
tunesmith / LLaMA-Factory. LLaMA-Factory runs from wheels installed into a private
--target folder (its pinned transformers/peft), never on tunesmith's stack.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

CASES: dict[str, dict[str, Any]] = {
    "natural": {"data": "alpaca", "tunesmith": {}, "llamafactory": {}},
    "best": {"data": "alpaca", "tunesmith": "natural",
             "llamafactory": {"enable_liger_kernel": True, "neat_packing": True,
                              "disable_gradient_checkpointing": True}},
    "recompute": {"data": "alpaca", "tunesmith": {"gradient_checkpointing": "true"},
                  "llamafactory": {"enable_liger_kernel": True, "neat_packing": True}},
    "dense": {"data": "dense", "tunesmith": {},
              "llamafactory": {"enable_liger_kernel": True,
                               "disable_gradient_checkpointing": True}},
    # the natural run again: its compile warm-up comes from the cache the first one wrote
    "cached": {"data": "alpaca", "tunesmith": {}, "llamafactory": None},
}
# the order runs are made in, most telling first (a run that does not fit is skipped)
RUN_ORDER = [("tunesmith", "natural"), ("llamafactory", "best"), ("tunesmith", "recompute"),
             ("llamafactory", "recompute"), ("tunesmith", "dense"), ("llamafactory", "dense"),
             ("llamafactory", "natural"), ("tunesmith", "cached")]
SRC = Path(__file__).resolve().parents[2]


def base_keys(model_dir: Path, data_dir: Path, dataset: str, steps: int, out: Path
              ) -> dict[str, Any]:
    """The keys a LLaMA-Factory user writes for this LoRA run, shared by both systems."""
    packing = dataset == "alpaca"
    return {"model_name_or_path": str(model_dir), "stage": "sft", "do_train": True,
            "finetuning_type": "lora", "lora_rank": 16, "lora_alpha": 32, "lora_target": "all",
            "dataset": dataset, "dataset_dir": str(data_dir), "template": "qwen",
            "cutoff_len": 2048, "packing": packing, "preprocessing_num_workers": 8,
            "output_dir": str(out), "per_device_train_batch_size": 4,
            "gradient_accumulation_steps": 1, "learning_rate": 1e-4,
            "lr_scheduler_type": "constant", "max_steps": steps, "logging_steps": 10,
            "bf16": True, "plot_loss": False, "seed": 42}


def run_tunesmith(yaml_path: Path, out: Path, cap_s: float, env: dict[str, str]
                  ) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "tunesmith", "train", str(yaml_path)]
    status = _run(cmd, cap_s, env, out.with_suffix(".log"))
    summary_path = out / "run_summary.json"
    if status != "ok" or not summary_path.is_file():
        return {"status": status}
    s = json.loads(summary_path.read_text())
    p, sp = s["performance"], s.get("speed", {})
    return {"status": "ok", "tokens_per_s": p.get("steady_tokens_per_s", p["tokens_per_s"]),
            "peak_alloc_gb": p["peak_memory_gb"], "mfu": p.get("steady_mfu", p.get("mfu")),
            "flops_per_token": (p.get("steady_tflops", 0) * 1e12
                                / max(p.get("steady_tokens_per_s", 1e-9), 1e-9)),
            "steady_steps": p.get("steady_steps"), "warmup_steps": p.get("warmup_steps"),
            "time_to_first_step_s": sp.get("time_to_first_step_s"),
            "attention": sp.get("attention"), "compile": sp.get("compile"),
            "compile_fallback": sp.get("compile_fallback"),
            "packing_efficiency": s["data"].get("packing_efficiency")}


def run_llamafactory(yaml_path: Path, out: Path, cap_s: float, env: dict[str, str],
                     pad_id: int, python: str) -> dict[str, Any]:
    result = out.with_suffix(".result.json")
    result.unlink(missing_ok=True)
    runner = Path(__file__).with_name("lf_runner.py")
    cmd = [python, str(runner), str(yaml_path), str(result), str(pad_id)]
    status = _run(cmd, cap_s, env, out.with_suffix(".log"))
    if not result.is_file():
        return {"status": status}
    rec = json.loads(result.read_text())
    return {"status": status if rec.get("status") == "ok" else f"{status} ({rec.get('status')})",
            "tokens_per_s": rec.get("tokens_per_s"), "peak_alloc_gb": rec.get("peak_alloc_gb"),
            "steady_steps": rec.get("steady_steps"), "warmup_steps": rec.get("warmup_steps")}


def _run(cmd: list[str], cap_s: float, env: dict[str, str], log_path: Path) -> str:
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=cap_s, check=False)
        except subprocess.TimeoutExpired:
            return f"timeout after {cap_s:.0f} s"
    return "ok" if proc.returncode == 0 else f"exit {proc.returncode} (see {log_path.name})"


def install_llamafactory(wheels: Path, site: Path, log_path: Path) -> str | None:
    """LLaMA-Factory and its pinned stack into `site`; None when ready, else the reason."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not any(w.name.startswith("llamafactory-") for w in found):
        return f"no llamafactory wheel in {wheels}"
    if not (site / "llamafactory").is_dir():
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
               "--no-compile", "--target", str(site), *map(str, found)]
        with open(log_path, "w") as log:
            if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode:
                return f"pip install of the wheels failed (see {log_path.name})"
    probe = subprocess.run([sys.executable, "-c", "import torchaudio"],
                           env={**os.environ, "PYTHONPATH": str(site)}, capture_output=True)
    if probe.returncode:  # LLaMA-Factory imports torchaudio at module level, never uses it
        stub = site.parent / (site.name + "-stubs") / "torchaudio"
        stub.mkdir(parents=True, exist_ok=True)
        (stub / "__init__.py").write_text('__version__ = "0.0.0"  # text-only runs\n')
    return None


def lf_env(opts: Any) -> dict[str, str]:
    """LLaMA-Factory's environment: its --target folder first (or its own interpreter)."""
    site = Path(opts.lf_site)
    stubs = site.parent / (site.name + "-stubs")
    path = "" if opts.lf_python else f"{site}:{stubs}" if stubs.is_dir() else str(site)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if path:
        env["PYTHONPATH"] = path
    return {**env, "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "0"),
            "DISABLE_VERSION_CHECK": "1", "WANDB_DISABLED": "true", "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1"}


def ts_env(work: Path) -> dict[str, str]:
    path = os.pathsep.join([str(SRC), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, "PYTHONPATH": path, "TUNESMITH_CACHE": str(work / "cache"),
            "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "0"}


def case_yaml(system: str, case: str, assets: Any, steps: int, runs: Path, cpu: bool
              ) -> tuple[Path, Path]:
    spec = CASES[case]
    out = runs / f"{system}-{case}"
    shutil.rmtree(out, ignore_errors=True)
    keys = base_keys(assets.model_dir, assets.data_dir, spec["data"], steps, out)
    extra = spec[system]
    keys.update(CASES[extra][system] if isinstance(extra, str) else extra)
    if system == "tunesmith":
        keys.update({"save_steps": 0, "overwrite_output_dir": True})
    else:  # keys tunesmith spells differently or has no use for
        keys.update({"save_strategy": "no", "report_to": "none", "overwrite_cache": True,
                     "disable_tqdm": True})
        if keys.get("neat_packing"):
            keys["packing"] = True
    if cpu:  # the CPU check: fp32, and no GPU-only kernels
        keys.update({"bf16": False, "enable_liger_kernel": False, "cutoff_len": 256})
    path = runs / f"{system}-{case}.yaml"
    path.write_text(yaml.safe_dump(keys, sort_keys=False))
    return path, out


def ratios(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per case: both systems' figures, LLaMA-Factory's MFU from tunesmith's FLOPs per
    token on the same samples, and the tokens/s ratio."""
    table: dict[str, Any] = {}
    for case, spec in CASES.items():
        if spec["llamafactory"] is None:
            continue
        ours = results.get(f"tunesmith-{spec['tunesmith']}" if isinstance(spec["tunesmith"], str)
                           else f"tunesmith-{case}")
        theirs = results.get(f"llamafactory-{case}")
        if ours is None and theirs is None:
            continue
        row: dict[str, Any] = {"tunesmith": ours, "llamafactory": theirs, "ratio": None}
        ok = (ours or {}).get("tokens_per_s") and (theirs or {}).get("tokens_per_s")
        if ok:
            row["ratio"] = round(ours["tokens_per_s"] / theirs["tokens_per_s"], 3)
            if ours.get("mfu") is not None:
                theirs["mfu"] = ours["mfu"] * theirs["tokens_per_s"] / ours["tokens_per_s"]
        table[case] = row
    return table


def write_report(out: Path, table: dict[str, Any], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "e2e.json").write_text(json.dumps({"meta": meta, "cases": table}, indent=2,
                                             default=str))
    lines = [f"# End-to-end: tunesmith train vs llamafactory-cli train ({meta['shape']})", "",
             f"{meta['device']}; LoRA r16/alpha 32 on all projections, micro-batch 4 x 2048, "
             "bf16; steady-state non-pad tokens/s.", "",
             "| case | tunesmith tok/s | GB | MFU | LLaMA-Factory tok/s | GB | MFU | ratio |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for case, row in table.items():
        lines.append(f"| {case} | {_cells(row['tunesmith'])} | {_cells(row['llamafactory'])} "
                     f"| {row['ratio'] if row['ratio'] is not None else 'n/a'} |")
    first = meta["time_to_first_step_s"]
    if first.get("first") and first.get("second_cached"):
        lines += ["", f"Time to the first step (natural YAML): {first['first']:.0f} s; the same "
                  f"run again with the compile cache: {first['second_cached']:.0f} s."]
    lines += ["", "Runs that did not finish: " + (", ".join(
        f"{k}: {v['status']}" for k, v in meta["runs"].items() if v.get("status") != "ok")
        or "none"), ""]
    (out / "e2e.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _cells(r: dict[str, Any] | None) -> str:
    if not r or not r.get("tokens_per_s"):
        return f"{(r or {}).get('status', 'not run')} | | "
    mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a"
    gb = f"{r['peak_alloc_gb']:.1f}" if r.get("peak_alloc_gb") is not None else "n/a"
    return f"{r['tokens_per_s']:,.0f} | {gb} | {mfu}"


def run_e2e(opts: Any) -> dict[str, Any]:
    """Build the inputs, make the runs in RUN_ORDER within the budget, write the report."""
    import torch

    from tunesmith.benchmarks.e2e_assets import build_assets

    start = time.perf_counter()
    device = torch.device("cuda" if torch.cuda.is_available() and not opts.tiny else "cpu")
    shape = "tiny" if opts.tiny else "qwen2.5-7b"
    runs = Path(opts.work) / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    assets = build_assets(Path(opts.work), shape, opts.samples, device)
    lf_problem = ("not asked for" if "llamafactory" not in opts.systems else None
                  if opts.lf_python else install_llamafactory(Path(opts.wheels),
                                                              Path(opts.lf_site),
                                                              runs / "lf-install.log"))
    results: dict[str, dict[str, Any]] = {}
    for system, case in RUN_ORDER:
        spec = CASES[case][system]
        if system not in opts.systems or case not in opts.cases or not isinstance(spec, dict):
            continue  # not asked for, the same run as another case, or no such run
        left = opts.budget_s - (time.perf_counter() - start)
        key = f"{system}-{case}"
        if system == "llamafactory" and lf_problem:
            results[key] = {"status": f"skipped: {lf_problem}"}
        elif left < opts.min_run_s:
            results[key] = {"status": f"skipped: {left:.0f} s of the budget left"}
        else:
            results[key] = run_case(system, case, opts, assets, min(opts.run_cap_s, left),
                                    device.type == "cpu")
        print(f"[e2e] {key}: {json.dumps(results[key], default=str)[:300]}", flush=True)
    meta = {"shape": shape, "device": torch.cuda.get_device_name(0) if device.type == "cuda"
            else "cpu", "runs": results, "wall_s": time.perf_counter() - start,
            "steps": {"tunesmith": opts.steps, "llamafactory": opts.lf_steps},
            "time_to_first_step_s": {
                "first": results.get("tunesmith-natural", {}).get("time_to_first_step_s"),
                "second_cached": results.get("tunesmith-cached", {}).get("time_to_first_step_s")}}
    table = ratios(results)
    write_report(Path(opts.out), table, meta)
    return {"meta": meta, "cases": table}


def run_case(system: str, case: str, opts: Any, assets: Any, cap: float, cpu: bool
             ) -> dict[str, Any]:
    runs = Path(opts.work) / "runs"
    steps = opts.steps if system == "tunesmith" else opts.lf_steps
    path, out = case_yaml(system, case, assets, steps, runs, cpu)
    if system == "tunesmith":
        return run_tunesmith(path, out, cap, ts_env(Path(opts.work)))
    from transformers import AutoTokenizer

    pad_id = AutoTokenizer.from_pretrained(assets.model_dir).pad_token_id
    return run_llamafactory(path, out, cap, lf_env(opts), pad_id,
                            opts.lf_python or sys.executable)


def parse_args(argv: list[str]) -> Any:
    import argparse

    ap = argparse.ArgumentParser(prog="tunesmith bench --e2e", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.environ.get("OUT", "e2e-out"),
                    help="where e2e.json and e2e.md go (default $OUT)")
    ap.add_argument("--tiny", action="store_true",
                    help="CPU check: tiny model, few steps, tunesmith runs only")
    ap.add_argument("--work", default="/tmp/tunesmith-e2e", help="model, data and run folders")
    ap.add_argument("--wheels", default=".carry/whl", help="LLaMA-Factory 0.9.5 wheels")
    ap.add_argument("--lf-site", default="/tmp/tunesmith-e2e-lf", help="its --target folder")
    ap.add_argument("--lf-python", default="",
                    help="an interpreter with LLaMA-Factory installed (instead of the wheels)")
    ap.add_argument("--cases", default=",".join(CASES),
                    help=f"comma-separated, from {', '.join(CASES)}")
    ap.add_argument("--systems", default="tunesmith,llamafactory")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--steps", type=int, default=30, help="tunesmith steps per run")
    ap.add_argument("--lf-steps", type=int, default=20, help="LLaMA-Factory steps per run")
    ap.add_argument("--budget-s", type=float, default=525.0, help="whole benchmark, seconds")
    ap.add_argument("--run-cap-s", type=float, default=110.0, help="one run, seconds")
    ap.add_argument("--min-run-s", type=float, default=40.0,
                    help="skip a run when less than this is left of the budget")
    opts = ap.parse_args(argv)
    opts.cases = [c for c in opts.cases.split(",") if c]
    opts.systems = [s for s in opts.systems.split(",") if s]
    unknown = [c for c in opts.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}")
    if opts.tiny and not opts.lf_python:
        opts.systems = [s for s in opts.systems if s == "tunesmith"]
        opts.samples, opts.steps = min(opts.samples, 64), min(opts.steps, 4)
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(list(sys.argv[1:] if argv is None else argv))
    report = run_e2e(opts)
    ran = [r for r in report["meta"]["runs"].values() if r.get("status") == "ok"]
    return 0 if ran else 1
