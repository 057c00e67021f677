"""LLaMA-Factory's DPO, KTO and reward-model example YAMLs run unchanged on its demo data,
but for the model (SmolLM2-135M-Instruct instead of Qwen3-4B), its chat template (the
tokenizer's own ChatML: tunesmith has no qwen3_nothink template yet), the data folder and
output folder (paths of this test) and a step limit (one optimizer step of the examples'
8 accumulated pairs; the examples train 3 epochs)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from tunesmith.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures" / "lf_pref"


@pytest.mark.slow
@pytest.mark.parametrize("example,metric", [("qwen3_lora_dpo", "rewards/accuracies"),
                                            ("qwen3_lora_kto", "kl"),
                                            ("qwen3_lora_reward", "rewards/accuracies")])
def test_llamafactory_preference_examples_run(example, metric, tmp_path, monkeypatch):
    monkeypatch.delenv("TUNESMITH_CACHE")  # the real, shared model cache
    data = Path(shutil.copytree(FIXTURES, tmp_path / "data"))
    out = tmp_path / "out"
    code = main(["train", str(data / f"{example}.yaml"),
                 "model_name_or_path=smollm2-135m-instruct", "template=",
                 f"dataset_dir={data}", f"output_dir={out}", "max_steps=1"])
    assert code == 0
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 1 and metric in records[0]
    assert (out / "adapter_model.safetensors").is_file()
    if example == "qwen3_lora_reward":
        assert (out / "value_head.safetensors").is_file()
