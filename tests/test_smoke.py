"""End-to-end training on a tiny model: the outputs a run promises are all there."""

from __future__ import annotations

import json

from peft import PeftModel
from transformers import AutoModelForCausalLM

from tunesmith.config import load_config
from tunesmith.recipes.sft import run_sft


def test_lora_run_writes_every_output(tmp_path, tiny_llama_dir, alpaca_file):
    out = tmp_path / "run"
    cfg = load_config(overrides={
        "model_name_or_path": str(tiny_llama_dir), "dataset": str(alpaca_file),
        "output_dir": str(out), "max_steps": 4, "per_device_train_batch_size": 4,
        "learning_rate": 1e-3, "logging_steps": 1, "save_steps": 2, "lora_rank": 4})
    summary = run_sft(cfg)
    for name in ("adapter_model.safetensors", "adapter_config.json", "tokenizer_config.json",
                 "config.resolved.yaml", "metrics.jsonl", "loss.png", "run_summary.json",
                 "checkpoint-2/trainer_state.json"):
        assert (out / name).exists(), name
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "elapsed_s", "eta_s", "peak_mem_gb",
                "epoch"):
        assert key in records[-1]
    assert summary["steps"] == 4
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    PeftModel.from_pretrained(base, out)  # loads as a normal PEFT adapter
