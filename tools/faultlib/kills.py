"""kill -9 of real `tunesmith train` / `tunesmith export` processes at chosen and random
points; the next run (resume_from_checkpoint=auto, or the same export again) must finish
with weights bitwise equal to an uninterrupted run."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from safetensors.torch import load_file

TOOLS = Path(__file__).parents[1]
SRC = TOOLS.parent / "src"
PHASES = ("data_prep", "cache_write", "mid_step", "checkpoint_write", "export", "timer")


def _env(cache: Path) -> dict[str, str]:
    path = os.pathsep.join([str(SRC), str(TOOLS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1",
            "TUNESMITH_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}


def run_cli(args: list[str], cache: Path, phase: str | None = None, k: int = 0,
            kill_after: float | None = None) -> tuple[int, str]:
    """Run `tunesmith ARGS` in a child (armed to die at `phase`/`k`, or SIGKILLed from
    outside after `kill_after` seconds); returns (return code, output)."""
    head = [sys.executable, str(TOOLS / "faults.py"), "child", phase, str(k)] if phase else [
        sys.executable, "-m", "tunesmith"]
    proc = subprocess.Popen([*head, *args], env=_env(cache), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    if kill_after is not None:
        try:
            out = proc.communicate(timeout=kill_after)[0]
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            out = proc.communicate()[0]
    else:
        out = proc.communicate(timeout=900)[0]
    return proc.returncode, out


def write_train_config(work: Path, model: Path, data: Path, out: Path) -> Path:
    cfg = {"model_name_or_path": str(model), "dataset": str(data), "output_dir": str(out),
           "max_steps": 12, "save_steps": 4, "logging_steps": 2, "learning_rate": 2e-3,
           "per_device_train_batch_size": 2, "gradient_accumulation_steps": 2,
           "lora_rank": 4, "lora_dropout": 0.1, "seed": 7, "warmup_steps": 2,
           "preprocessing_num_workers": 1, "plot_loss": False}
    path = work / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def write_export_config(work: Path, model: Path, adapter: Path, out: Path) -> Path:
    path = work / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": str(model),
                                    "adapter_name_or_path": str(adapter),
                                    "export_dir": str(out)}))
    return path


def _tensors(path: Path) -> dict[str, Any]:
    return load_file(str(path)) if path.is_file() else {}


def same_tensors(a: Path, b: Path) -> bool:
    x, y = _tensors(a), _tensors(b)
    import torch

    return bool(x) and x.keys() == y.keys() and all(torch.equal(x[n], y[n]) for n in x)


class KillCampaign:
    """One uninterrupted reference run, then `count` killed runs and their re-runs."""

    def __init__(self, work: Path, model: Path, data: Path, seed: int = 0):
        self.work, self.model, self.data = work, model, data
        self.rng = random.Random(seed)
        self.ref = work / "reference"
        self.ref_export = work / "reference-export"
        self.rows: list[dict[str, Any]] = []

    def reference(self) -> float:
        """The uninterrupted run and its export; returns the training run's seconds."""
        t0 = time.perf_counter()
        cfg = write_train_config(self.work, self.model, self.data, self.ref)
        rc, out = run_cli(["train", str(cfg)], self.work / "cache-ref")
        assert rc == 0, out
        seconds = time.perf_counter() - t0
        rc, out = run_cli(["export", str(write_export_config(
            self.work, self.model, self.ref, self.ref_export))], self.work / "cache-ref")
        assert rc == 0, out
        return seconds

    def one(self, i: int, phase: str, duration: float) -> dict[str, Any]:
        k = {"data_prep": self.rng.randint(1, 40), "cache_write": self.rng.randint(1, 2),
             "mid_step": self.rng.randint(1, 12), "checkpoint_write": self.rng.randint(1, 14),
             "export": self.rng.randint(1, 2), "timer": 0}[phase]
        if phase == "export":
            return self._export(i, k)
        out_dir = self.work / f"run-{i}"
        cache = self.work / f"cache-{i}"
        cfg = write_train_config(self.work, self.model, self.data, out_dir)
        if phase == "timer":
            rc = self._timer_kill(cfg, out_dir, cache, duration)
        else:
            rc, _ = run_cli(["train", str(cfg)], cache, phase, k)
        ckpts = sorted(p.name for p in out_dir.glob("checkpoint-*")) if out_dir.exists() else []
        rc2, log = run_cli(["train", str(cfg), "resume_from_checkpoint=auto"], cache)
        equal = rc2 == 0 and same_tensors(self.ref / "adapter_model.safetensors",
                                          out_dir / "adapter_model.safetensors")
        return {"phase": phase, "k": k, "killed": rc == -signal.SIGKILL, "checkpoints": ckpts,
                "rerun_rc": rc2, "bitwise_equal": equal, "ok": rc == -signal.SIGKILL and equal,
                "tail": "" if equal else log[-600:]}

    def _timer_kill(self, cfg: Path, out_dir: Path, cache: Path, duration: float) -> int:
        """SIGKILL from outside after a random share of a run's time; a run that finished
        first (the machine got faster) is started again with half the delay."""
        delay = self.rng.uniform(0.3, 0.9) * duration
        for _ in range(4):
            rc, _ = run_cli(["train", str(cfg)], cache, kill_after=delay)
            if rc == -signal.SIGKILL:
                break
            shutil.rmtree(out_dir, ignore_errors=True)
            shutil.rmtree(cache, ignore_errors=True)
            delay /= 2
        return rc

    def _export(self, i: int, k: int) -> dict[str, Any]:
        out = self.work / f"export-{i}"
        cfg = write_export_config(self.work, self.model, self.ref, out)
        rc, _ = run_cli(["export", str(cfg)], self.work / "cache-ref", "export", k)
        half = out.exists()  # a killed export must leave nothing under the asked name
        rc2, log = run_cli(["export", str(cfg)], self.work / "cache-ref")
        equal = rc2 == 0 and same_tensors(self.ref_export / "model.safetensors",
                                          out / "model.safetensors")
        return {"phase": "export", "k": k, "killed": rc == -signal.SIGKILL, "checkpoints": [],
                "rerun_rc": rc2, "bitwise_equal": equal,
                "ok": rc == -signal.SIGKILL and equal and not half,
                "tail": "" if equal else log[-600:]}


def kill_campaign(work: Path, model: Path, data: Path, count: int = 20,
                  phases: tuple[str, ...] = PHASES) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    camp = KillCampaign(work, model, data)
    duration = camp.reference()
    for i in range(count):
        camp.rows.append(camp.one(i, phases[i % len(phases)], duration))
    good = sum(r["ok"] for r in camp.rows)
    return {"fault": "kill -9 at random points of a run", "count": count, "ok": good,
            "how": f"SIGKILL during {', '.join(phases)} (k-th event drawn at random; 'timer': "
                   "killed from outside after a random 30-90% of a run's time); then "
                   "resume_from_checkpoint=auto (or the same export) again",
            "notes": [f"{r['phase']} k={r['k']}: {r['tail']}" for r in camp.rows
                      if not r["ok"]][:5], "runs": camp.rows}
