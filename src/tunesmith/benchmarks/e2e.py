"""End-to-end benchmark: `tunesmith train <yaml>` against `llamafactory-cli train <yaml>`
on the same model, file and keys, each as its own process (what a user runs), and against
Unsloth's FastLanguageModel (16-bit LoRA) on the dense rows.

    cases          tunesmith                        LLaMA-Factory 0.9.5          Unsloth
    natural        packing, bf16 (no speed key)     the same YAML (recompute)    -
    best           the natural run (auto = tuned)   + liger, neat_packing, no gc -
    recompute      + gradient_checkpointing: true   + liger, neat_packing (gc)   -
    dense          2048-token rows, no speed key    + liger, no recompute        no checkpointing
    cached         the natural run again (its compile warm-up from the cache), tunesmith only
    dense_recompute + gradient_checkpointing: offload + liger, recompute      "unsloth" (offloaded)
    unpacked       the alpaca YAML with packing:    + liger, no recompute        -
                   false (padded batches)

Figures: steady-state non-pad tokens/s (warm-up steps left out), peak allocated GB, MFU
(tunesmith's FLOP model, the same FLOPs per token for every system: same samples); `ratio` =
tunesmith / LLaMA-Factory, `ratio_unsloth` = tunesmith / Unsloth. LLaMA-Factory and Unsloth
run from wheels installed into private --target folders, never on tunesmith's stack; Unsloth
trains on the samples tunesmith's data pipeline made for the same YAML (unsloth_system.py).
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

from tunesmith.benchmarks.e2e_report import ratios, write_report
from tunesmith.benchmarks.unsloth_system import (
    export_rows,
    install_unsloth,
    missing_companions,
    run_unsloth,
    runner_spec,
)

CASES: dict[str, dict[str, Any]] = {
    "natural": {"data": "alpaca", "tunesmith": {}, "llamafactory": {}, "unsloth": None},
    "best": {"data": "alpaca", "tunesmith": "natural",
             "llamafactory": {"enable_liger_kernel": True, "neat_packing": True,
                              "disable_gradient_checkpointing": True}, "unsloth": None},
    "recompute": {"data": "alpaca", "tunesmith": {"gradient_checkpointing": "true"},
                  "llamafactory": {"enable_liger_kernel": True, "neat_packing": True},
                  "unsloth": None},
    "dense": {"data": "dense", "tunesmith": {},
              "llamafactory": {"enable_liger_kernel": True,
                               "disable_gradient_checkpointing": True},
              "unsloth": {"gradient_checkpointing": False}},
    # the natural run again: its compile warm-up comes from the cache the first one wrote
    "cached": {"data": "alpaca", "tunesmith": {}, "llamafactory": None, "unsloth": None},
    "dense_recompute": {"data": "dense", "tunesmith": {"gradient_checkpointing": "offload"},
                        "llamafactory": {"enable_liger_kernel": True},
                        "unsloth": {"gradient_checkpointing": "unsloth"}},
    # LLaMA-Factory's default data path: batches padded to their longest row, whose length
    # changes from step to step (kernels that build a plan per shape pay for each new one)
    "unpacked": {"data": "alpaca", "tunesmith": {"packing": False},
                 "llamafactory": {"packing": False, "enable_liger_kernel": True,
                                  "disable_gradient_checkpointing": True}, "unsloth": None},
}
SYSTEMS = ("tunesmith", "llamafactory", "unsloth")
# the order runs are made in, most telling first (a run that does not fit is skipped)
RUN_ORDER = [("tunesmith", "natural"), ("llamafactory", "best"), ("tunesmith", "recompute"),
             ("llamafactory", "recompute"), ("tunesmith", "dense"), ("llamafactory", "dense"),
             ("llamafactory", "natural"), ("tunesmith", "cached"), ("unsloth", "dense"),
             ("tunesmith", "dense_recompute"), ("unsloth", "dense_recompute"),
             ("llamafactory", "dense_recompute"), ("tunesmith", "unpacked"),
             ("llamafactory", "unpacked")]
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
            "packing_efficiency": s["data"].get("packing_efficiency"),
            "loss_last": s.get("final_loss")}


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
    """The case's YAML for `system`; Unsloth gets tunesmith's (its rows are made from it)."""
    spec = CASES[case]
    out = runs / f"{system}-{case}"
    shutil.rmtree(out, ignore_errors=True)
    keys = base_keys(assets.model_dir, assets.data_dir, spec["data"], steps, out)
    as_system = "tunesmith" if system == "unsloth" else system
    extra = spec[as_system]
    keys.update(CASES[extra][as_system] if isinstance(extra, str) else extra)
    if as_system == "tunesmith":
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
    problems = install_peers(opts, runs)
    results: dict[str, dict[str, Any]] = {}
    for system, case in RUN_ORDER:
        spec = CASES[case][system]
        if system not in opts.systems or case not in opts.cases or not isinstance(spec, dict):
            continue  # not asked for, the same run as another case, or no such run
        left = opts.budget_s - (time.perf_counter() - start)
        key = f"{system}-{case}"
        if problems.get(system):
            results[key] = {"status": f"skipped: {problems[system]}"}
        elif left < opts.min_run_s:
            results[key] = {"status": f"skipped: {left:.0f} s of the budget left"}
        else:
            results[key] = run_case(system, case, opts, assets, run_cap(system, opts, left),
                                    device.type == "cpu")
        print(f"[e2e] {key}: {json.dumps(results[key], default=str)[:300]}", flush=True)
    meta = {"shape": shape, "device": torch.cuda.get_device_name(0) if device.type == "cuda"
            else "cpu", "runs": results, "wall_s": time.perf_counter() - start,
            "steps": {"tunesmith": opts.steps, "llamafactory": opts.lf_steps,
                      "unsloth": opts.uns_steps},
            "unsloth_site_lacks": problems.get("unsloth_site_lacks"),
            "time_to_first_step_s": {
                "first": results.get("tunesmith-natural", {}).get("time_to_first_step_s"),
                "second_cached": results.get("tunesmith-cached", {}).get("time_to_first_step_s")}}
    table = ratios(results, CASES)
    write_report(Path(opts.out), table, meta)
    return {"meta": meta, "cases": table}


def install_peers(opts: Any, runs: Path) -> dict[str, Any]:
    """Install the asked-for peers from their wheels; system -> why its runs are skipped."""
    problems: dict[str, Any] = {}
    if "llamafactory" in opts.systems and not opts.lf_python:
        problems["llamafactory"] = install_llamafactory(Path(opts.wheels), Path(opts.lf_site),
                                                        runs / "lf-install.log")
    if "unsloth" in opts.systems:
        site = Path(opts.uns_site)
        problems["unsloth"] = install_unsloth(Path(opts.uns_wheels), site,
                                              runs / "unsloth-install.log")
        # bitsandbytes and torchao come from an earlier call: noted, the run still tries
        problems["unsloth_site_lacks"] = missing_companions(site) or None
    return problems


def run_cap(system: str, opts: Any, left: float) -> float:
    """Seconds one run may take: its system's cap (Unsloth's import and load take longer),
    at most what is left of the budget."""
    return min(opts.uns_run_cap_s if system == "unsloth" else opts.run_cap_s, left)


def run_case(system: str, case: str, opts: Any, assets: Any, cap: float, cpu: bool
             ) -> dict[str, Any]:
    runs = Path(opts.work) / "runs"
    steps = {"tunesmith": opts.steps, "unsloth": opts.uns_steps}.get(system, opts.lf_steps)
    path, out = case_yaml(system, case, assets, steps, runs, cpu)
    if system == "unsloth":
        return run_unsloth_case(case, path, assets, opts, cap)
    if system == "tunesmith":
        return run_tunesmith(path, out, cap, ts_env(Path(opts.work)))
    from transformers import AutoTokenizer

    pad_id = AutoTokenizer.from_pretrained(assets.model_dir).pad_token_id
    return run_llamafactory(path, out, cap, lf_env(opts), pad_id,
                            opts.lf_python or sys.executable)


def run_unsloth_case(case: str, yaml_path: Path, assets: Any, opts: Any, cap: float
                     ) -> dict[str, Any]:
    """Unsloth on the samples tunesmith's pipeline makes for the case's YAML."""
    runs = yaml_path.parent
    rows = runs / f"unsloth-{case}.rows.npz"
    data = export_rows(yaml_path, rows, opts.uns_steps)
    gc = CASES[case]["unsloth"]["gradient_checkpointing"]
    spec = runner_spec(assets.model_dir, rows, runs / f"unsloth-{case}.result.json", data, gc)
    return run_unsloth(spec, runs / f"unsloth-{case}.log", cap, Path(opts.uns_site))


def add_unsloth_options(ap: Any) -> None:
    ap.add_argument("--uns-site", default="/tmp/site_uns",
                    help="Unsloth's --target folder (bitsandbytes, torchao put there earlier)")
    ap.add_argument("--uns-wheels", default=".carry/uns",
                    help="Unsloth 2026.10.9 and what the device lacks, as wheels")
    ap.add_argument("--uns-steps", type=int, default=30, help="Unsloth steps per run")
    ap.add_argument("--uns-run-cap-s", type=float, default=200.0,
                    help="one Unsloth run, seconds (its import and load take longer)")


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
    ap.add_argument("--systems", default="tunesmith,llamafactory",
                    help=f"comma-separated, from {', '.join(SYSTEMS)}")
    add_unsloth_options(ap)
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
    for name, given, known in (("case", opts.cases, CASES), ("system", opts.systems, SYSTEMS)):
        unknown = [g for g in given if g not in known]
        if unknown:
            ap.error(f"unknown {name}(s) {unknown}; choose from {', '.join(known)}")
    if opts.tiny:  # LLaMA-Factory only with --lf-python; Unsloth only when named
        opts.systems = [s for s in opts.systems if s != "llamafactory" or opts.lf_python]
        opts.samples, opts.steps = min(opts.samples, 64), min(opts.steps, 4)
        opts.uns_steps = min(opts.uns_steps, 4)
    return opts


def main(argv: list[str] | None = None) -> int:
    opts = parse_args(list(sys.argv[1:] if argv is None else argv))
    report = run_e2e(opts)
    ran = [r for r in report["meta"]["runs"].values() if r.get("status") == "ok"]
    return 0 if ran else 1
