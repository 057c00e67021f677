"""`import tunesmith; tunesmith.train(...)`: the CLI's verbs as functions, same checks."""

from __future__ import annotations

import pytest

import tunesmith
from tunesmith.errors import ConfigError


def test_train_export_evaluate_chat_from_python(tmp_path, tiny_llama_dir, alpaca_file):
    keys = {"model_name_or_path": str(tiny_llama_dir), "dataset": str(alpaca_file),
            "output_dir": str(tmp_path / "run"), "lora_rank": 4, "learning_rate": 1e-3,
            "per_device_train_batch_size": 4, "save_steps": 0, "val_size": 4}
    summary = tunesmith.train(keys, max_steps=2)  # keyword overrides win
    assert summary["steps"] == 2 and (tmp_path / "run/adapter_model.safetensors").exists()
    out = tunesmith.export({"model_name_or_path": str(tiny_llama_dir),
                            "adapter_name_or_path": str(tmp_path / "run"),
                            "export_dir": str(tmp_path / "merged")})
    assert (out / "model.safetensors").exists()
    results = tunesmith.evaluate(keys, model_name_or_path=str(out), eval_dataset=str(alpaca_file))
    assert results["eval_loss"] > 0
    chat = tunesmith.chat(model_name_or_path=str(out), device="cpu")
    first = chat("What is 2 + 2?", max_new_tokens=4, temperature=0)
    assert first == chat([{"role": "user", "content": "What is 2 + 2?"}], max_new_tokens=4,
                         temperature=0)


def test_yaml_path_and_the_same_errors_as_the_cli(tmp_path):
    path = tmp_path / "cfg.yaml"
    path.write_text("learning_rate: 1.0e-4\nlora_rnk: 8\n")
    with pytest.raises(ConfigError, match="did you mean lora_rank"):
        tunesmith.train(str(path))
    with pytest.raises(ConfigError, match="expected a YAML path"):
        tunesmith.train(42)
    assert tunesmith.load(None, lora_rank=4).finetuning.lora_rank == 4
