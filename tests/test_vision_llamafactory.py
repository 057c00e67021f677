"""LLaMA-Factory's multimodal example YAML (train_lora/qwen3vl_lora_sft.yaml) and its
mllm_demo data run unchanged on the tiny Qwen2-VL: only the model is swapped (and the run
is cut to a few steps to keep CI short)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tunesmith.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures" / "llamafactory"
pytestmark = pytest.mark.slow


def test_qwen3vl_lora_sft_example_on_the_tiny_vlm(tmp_path, tiny_vl_dir, monkeypatch):
    shutil.copytree(FIXTURES / "data", tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    rc = main(["train", str(FIXTURES / "qwen3vl_lora_sft.yaml"),
               f"model_name_or_path={tiny_vl_dir}", "max_steps=1"])
    assert rc == 0
    out = tmp_path / "saves" / "qwen3-vl-4b" / "lora" / "sft"
    data = json.loads((out / "run_summary.json").read_text())["data"]
    rows = 6 + 70 + 8  # mllm_demo, identity (built in), the alpaca_en_demo excerpt
    assert data["rows"] == rows and data["bad_rows"] == 0 and data["samples"] == rows
    assert (out / "preprocessor_config.json").is_file()
    resolved = (out / "config.resolved.yaml").read_text()
    assert "image_max_pixels: 262144" in resolved and "template: qwen3_vl_nothink" in resolved
