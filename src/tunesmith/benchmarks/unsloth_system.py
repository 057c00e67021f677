"""Unsloth as the end-to-end benchmark's third system (dense cases only).

The benchmark's own process writes the rows of tunesmith's case (the same YAML keys through
tunesmith's data pipeline: chat template, cutoff_len, the epoch order of its micro-batches)
into an .npz file; `unsloth_runner.py` then trains on exactly those rows in its own process,
with Unsloth 2026.10.9 installed from carried wheels into a private --target folder. Nothing
here imports unsloth: the runner does, in that process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from tunesmith.data.batching import epoch_batches
from tunesmith.data.encode import IGNORE_INDEX
from tunesmith.train.throughput import steady_state

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# installed by an earlier call into the same folder (they do not fit one call's 64 MiB)
COMPANIONS = ("bitsandbytes", "torchao")


def install_unsloth(wheels: Path, site: Path, log_path: Path) -> str | None:
    """Unsloth and the packages the device lacks into `site`, unless every carried wheel is
    installed there already; None when ready, else the reason (the benchmark then records it
    as the Unsloth runs' status). Without wheels, a site that holds unsloth is used as is."""
    found = sorted(wheels.glob("*.whl")) if wheels.is_dir() else []
    if not any(w.name.startswith("unsloth-") for w in found):
        if (site / "unsloth").is_dir():
            return None
        return f"no unsloth wheel in {wheels} (see docs/benchmarks/README.md for the list)"
    if all(_installed(site, w) for w in found):
        return None
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--upgrade", "--target", str(site), *map(str, found)]
    with open(log_path, "w") as log:
        if subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode:
            return f"pip install of the Unsloth wheels failed (see {log_path.name})"
    return None


def _installed(site: Path, wheel: Path) -> bool:
    """A wheel's name-version.dist-info folder is in `site` (wheel file names carry both)."""
    name, version = wheel.name.split("-")[:2]
    return (site / f"{name}-{version}.dist-info").is_dir()


def missing_companions(site: Path) -> list[str]:
    return [name for name in COMPANIONS if not (site / name).is_dir()]


def uns_env(site: Path) -> dict[str, str]:
    """Unsloth's environment: its --target folder alone on PYTHONPATH, offline."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return {**env, "PYTHONPATH": str(site),
            "CUDA_VISIBLE_DEVICES": env.get("CUDA_VISIBLE_DEVICES", "0"),
            "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "UNSLOTH_DISABLE_STATISTICS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONUNBUFFERED": "1"}


def export_rows(yaml_path: Path, dest: Path, steps: int) -> dict[str, Any]:
    """The samples tunesmith trains on for `yaml_path` (its data pipeline, its epoch order),
    `steps` micro-batches of them, as `dest` (.npz). Returns the YAML's batch size, pad id
    and token counts."""
    from tunesmith.config.loader import load_config

    cfg = load_config(yaml_path)
    samples, pad_id = _tokenized_samples(cfg)
    bs, seed = cfg.training.per_device_train_batch_size, cfg.training.seed
    plan: list[list[int]] = []
    epoch = 0
    while len(plan) < steps:
        plan += epoch_batches(len(samples), bs, epoch, seed)
        epoch += 1
    plan = plan[:steps]
    order = [i for batch in plan for i in batch]
    lengths = np.array([len(samples[i]) for i in order], dtype=np.int64)
    ids = np.full((len(order), int(lengths.max())), pad_id, dtype=np.int32)
    labels = np.full(ids.shape, IGNORE_INDEX, dtype=np.int32)
    for row, i in enumerate(order):
        n = lengths[row]
        ids[row, :n] = samples[i].input_ids
        labels[row, :n] = samples[i].labels
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as fh:
        np.savez(fh, input_ids=ids, labels=labels, lengths=lengths,
                 batch_sizes=np.array([len(b) for b in plan], dtype=np.int64))
    return {"micro_batch": bs, "pad_id": pad_id, "tokens": int(lengths.sum()),
            "cutoff_len": cfg.data.cutoff_len, "learning_rate": cfg.training.learning_rate,
            "seed": seed, "lora_r": cfg.finetuning.lora_rank,
            "lora_alpha": cfg.finetuning.lora_alpha or 2 * cfg.finetuning.lora_rank}


def _tokenized_samples(cfg: Any) -> tuple[Any, int]:
    """What `tunesmith train` tokenises for this config (the steps of `data inspect`)."""
    from tunesmith.data.loading import DataContext, prepare_data
    from tunesmith.data.slot_renderer import make_renderer
    from tunesmith.data.template import load_template_source
    from tunesmith.models.loader import load_tokenizer
    from tunesmith.models.provision import resolve_model_path

    path = resolve_model_path(cfg.model.model_name_or_path, cfg.model.cache_dir or None)
    tokenizer = load_tokenizer(path)
    name, source = load_template_source(cfg.model.template, tokenizer)
    ctx = DataContext(make_renderer(name, source, tokenizer, cfg.template), tokenizer,
                      cfg.training.seed, cfg.finetuning.stage, cfg.training.overwrite_cache,
                      None, cfg.model.model_name_or_path)
    return prepare_data(cfg.data, ctx).train, int(tokenizer.pad_token_id)


def runner_spec(model_dir: Path, rows: Path, result: Path, data: dict[str, Any],
                gradient_checkpointing: str | bool) -> dict[str, Any]:
    """What unsloth_runner.py reads: the same LoRA (r, alpha, all 7 projections, no dropout),
    learning rate, sequence length and seed as the tunesmith YAML."""
    if gradient_checkpointing not in (False, "unsloth"):
        raise ValueError(f"gradient_checkpointing {gradient_checkpointing!r}: the Unsloth "
                         "cases use False or 'unsloth'")
    return {"model_dir": str(model_dir.resolve()), "rows": str(rows.resolve()),
            "result": str(result.resolve()),
            "max_seq_length": data["cutoff_len"], "pad_id": data["pad_id"],
            "lora_r": data["lora_r"], "lora_alpha": data["lora_alpha"],
            "lora_targets": list(LORA_TARGETS), "learning_rate": data["learning_rate"],
            "seed": data["seed"], "gradient_checkpointing": gradient_checkpointing}


def parse_result(record: dict[str, Any], run_status: str) -> dict[str, Any]:
    """The runner's record -> the benchmark's result dict (the shape the other systems
    give): steady-state tokens/s by tunesmith's warm-up rule, peak allocated GB, losses."""
    status = record.get("status", "no status")
    steps = [(float(s[0]), int(s[1]), int(s[2]), 0.0) for s in record.get("steps", [])]
    if status == "ok" or run_status == "ok":  # the one that is not ok, else ok
        status = run_status if status == "ok" else status
    else:  # the process's exit and the runner's own word on why
        status = f"{run_status} ({status})"
    out: dict[str, Any] = {"status": status}
    if steps:
        steady = steady_state(steps, None)
        out.update({"tokens_per_s": steady["steady_tokens_per_s"],
                    "trained_tokens_per_s": steady["steady_trained_tokens_per_s"],
                    "steady_steps": steady["steady_steps"],
                    "warmup_steps": steady["warmup_steps"]})
    losses = record.get("losses") or []
    out.update({"peak_alloc_gb": record.get("peak_alloc_gb"),
                "loss_first": round(losses[0], 4) if losses else None,
                "loss_last": round(losses[-1], 4) if losses else None,
                "load_s": record.get("load_s"), "versions": record.get("versions")})
    return out


def run_unsloth(spec: dict[str, Any], log_path: Path, cap_s: float, site: Path
                ) -> dict[str, Any]:
    """One Unsloth run as its own process; never raises for a failed run."""
    log_path = log_path.resolve()  # the runner's working folder is the log's folder
    spec_path = log_path.with_suffix(".spec.json")
    spec_path.write_text(json.dumps(spec, indent=1))
    result = Path(spec["result"])
    result.unlink(missing_ok=True)
    runner = Path(__file__).with_name("unsloth_runner.py")
    cmd = [sys.executable, str(runner), str(spec_path)]
    with open(log_path, "w") as log:
        try:
            proc = subprocess.run(cmd, env=uns_env(site), stdout=log, stderr=subprocess.STDOUT,
                                  timeout=cap_s, check=False, cwd=str(log_path.parent))
            run_status = "ok" if proc.returncode == 0 else \
                f"exit {proc.returncode} (see {log_path.name})"
        except subprocess.TimeoutExpired:
            run_status = f"timeout after {cap_s:.0f} s"
    if not result.is_file():
        return {"status": run_status}
    return parse_result(json.loads(result.read_text()), run_status)
