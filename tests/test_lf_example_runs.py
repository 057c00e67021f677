"""LLaMA-Factory example YAMLs run a few steps through `tunesmith train` (tunesmith.cli.main)
on a tiny model: model, dataset and paths substituted, template left to the tokenizer's
own (the tiny tokenizer is ChatML), and a few steps without worker processes."""

from __future__ import annotations

import json

import pytest

from lf_examples import write_run_yaml
from tunesmith.cli.main import main

FAST = {"max_steps": 2, "preprocessing_num_workers": 1, "dataloader_num_workers": 0,
        "gradient_accumulation_steps": 1, "per_device_train_batch_size": 2, "cutoff_len": 128,
        "template": "", "logging_steps": 1, "save_steps": 0, "report_to": "none"}

# example -> extra overrides it needs on a 2-layer model, and a file its method writes
RUNS = {
    "extras/loraplus/llama3_lora_sft.yaml": ({}, "adapter_model.safetensors"),
    "extras/pissa/llama3_lora_sft.yaml": ({}, "pissa_converted/adapter_model.safetensors"),
    "extras/dft/qwen2_full_sft.yaml": ({}, "model.safetensors"),
    "extras/muon/qwen2_full_sft.yaml": ({}, "model.safetensors"),
    "extras/asft/qwen2_full_asft.yaml": ({"deepspeed": ""}, "model.safetensors"),
    "extras/galore/llama3_full_sft.yaml": ({"galore_rank": 4}, "model.safetensors"),
    "extras/apollo/llama3_full_sft.yaml": ({"apollo_rank": 4}, "model.safetensors"),
    "extras/badam/llama3_full_sft.yaml": ({}, "model.safetensors"),
    "extras/adam_mini/qwen2_full_sft.yaml": ({}, "model.safetensors"),
    "extras/llama_pro/llama3_freeze_sft.yaml": ({"freeze_trainable_layers": 1},
                                                "model.safetensors"),
    "train_qlora/qwen3_lora_sft_otfq.yaml": ({}, "adapter_model.safetensors"),
}


@pytest.mark.parametrize("example", list(RUNS))
def test_example_runs_a_few_steps(example, tmp_path, tiny_llama_dir, alpaca_file):
    extra, artifact = RUNS[example]
    yaml_path = write_run_yaml(example, str(tiny_llama_dir), str(alpaca_file), tmp_path,
                               **FAST, **extra)
    assert main(["train", str(yaml_path)]) == 0
    out = tmp_path / "out"
    assert (out / artifact).exists()
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps[-1] == 2


def test_trainer_keys_through_the_cli(tmp_path, tiny_llama_dir, alpaca_file):
    """save_strategy epoch, logging_first_step, include_num_input_tokens_seen, run_name,
    data_seed, dataloader_drop_last, disable_tqdm, label_smoothing_factor, optim, and keys
    checked by unit tests, here once through the CLI: EAFT, group_by_length, rope_scaling,
    model loading keys, print_param_status, additional_target."""
    keys = {**FAST, "max_steps": 0, "num_train_epochs": 2, "logging_steps": 5,
            "per_device_train_batch_size": 5, "save_strategy": "epoch",
            "logging_first_step": True, "include_num_input_tokens_seen": True,
            "run_name": "lf-keys", "data_seed": 7, "dataloader_drop_last": True,
            "disable_tqdm": True, "label_smoothing_factor": 0.1, "optim": "adamw_8bit",
            "lr_scheduler_kwargs": {"min_lr_rate": 0.1}, "use_eaft_loss": True,
            "group_by_length": True, "rope_scaling": "linear", "model_max_length": 1024,
            "model_revision": "main", "use_fast_tokenizer": True, "low_cpu_mem_usage": False,
            "print_param_status": True, "additional_target": "lm_head",
            "ddp_find_unused_parameters": True, "neftune_noise_alpha": 5.0,
            "log_level": "info"}
    yaml_path = write_run_yaml("train_lora/qwen3_lora_sft.yaml", str(tiny_llama_dir),
                               str(alpaca_file), tmp_path, **keys)
    assert main(["train", str(yaml_path)]) == 0
    out = tmp_path / "out"
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records if "loss" in r]
    # 24 samples, batches of 5, last short one dropped: 4 steps an epoch, 8 in all
    assert steps == [1, 5, 8]
    assert records[0]["num_input_tokens_seen"] > 0
    assert records[-1]["lr"] == pytest.approx(1e-4 * 0.1)  # floor of min_lr_rate
    assert (out / "checkpoint-4").is_dir()  # end of epoch 1 (the last is the final save)
    assert json.loads((out / "run_summary.json").read_text())["run_name"] == "lf-keys"
    from safetensors.torch import load_file

    assert any("lm_head" in k for k in load_file(out / "adapter_model.safetensors"))
