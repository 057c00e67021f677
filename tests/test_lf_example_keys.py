"""Keys and files from LLaMA-Factory's examples that used to be refused, through the CLI:
gradient_checkpointing_kwargs (train_full/mossvl_full_sft.yaml), the token file
extras/multi_tokens/tokens_cfg.yaml given to `tunesmith train`, and a deepspeed key in
a single process without a launcher (train_full/qwen3_full_sft.yaml)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lf_examples import EXAMPLES, write_run_yaml
from test_lf_example_runs import FAST
from tunesmith.cli.main import main

DEEPSPEED = Path(__file__).parent / "fixtures" / "llamafactory_deepspeed"


def _summary(out: Path) -> dict:
    return json.loads((out / "run_summary.json").read_text())


def test_gradient_checkpointing_kwargs_use_reentrant_is_honoured(tmp_path, tiny_llama_dir,
                                                                 alpaca_file):
    path = write_run_yaml("train_lora/qwen3_lora_sft.yaml", str(tiny_llama_dir),
                          str(alpaca_file), tmp_path, **FAST, gradient_checkpointing=True,
                          gradient_checkpointing_kwargs={"use_reentrant": True})
    assert main(["train", str(path)]) == 0
    speed = _summary(tmp_path / "out")["speed"]
    assert speed["reentrant"] is True and speed["checkpointed_layers"] == 2
    assert speed["layer_runs"] > 0  # recompute ran


@pytest.mark.parametrize("kwargs,message", [
    ({"preserve_rng_state": False}, "preserve_rng_state not honoured by tunesmith"),
    ({"use_reentrant": "no"}, "use_reentrant must be true or false"),
])
def test_gradient_checkpointing_kwargs_it_cannot_honour_are_refused(
        kwargs, message, tmp_path, tiny_llama_dir, alpaca_file, capsys):
    path = write_run_yaml("train_lora/qwen3_lora_sft.yaml", str(tiny_llama_dir),
                          str(alpaca_file), tmp_path, **FAST, gradient_checkpointing_kwargs=kwargs)
    assert main(["train", str(path)]) == 1
    err = capsys.readouterr().err
    assert message in err and f"{path}:" in err  # the key's place in the YAML


def test_train_on_the_token_file_says_what_it_is(capsys):
    tokens = EXAMPLES / "extras" / "multi_tokens" / "tokens_cfg.yaml"
    assert main(["train", str(tokens)]) == 1
    err = capsys.readouterr().err
    assert f"{tokens} is not a training config" in err
    assert "16 special tokens (<|START_OF_SVG|>" in err
    assert f"new_special_tokens_config: {tokens}" in err


@pytest.mark.parametrize("ds_config", ["ds_z3_config.json"])
def test_deepspeed_runs_in_one_process_without_a_launcher(ds_config, tmp_path, tiny_llama_dir,
                                                          alpaca_file, monkeypatch):
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    path = write_run_yaml("train_full/qwen3_full_sft.yaml", str(tiny_llama_dir),
                          str(alpaca_file), tmp_path, **FAST,
                          deepspeed=str(DEEPSPEED / ds_config))
    assert main(["train", str(path)]) == 0
    out = tmp_path / "out"
    assert _summary(out)["steps"] == 2 and (out / "model.safetensors").is_file()
    # the process goes on: no LOCAL_RANK left for a later launcher to read as "already
    # launched", and a second DeepSpeed run in the same process works (the 1-rank group
    # and DeepSpeed's groups cloned from it stay valid)
    import os

    assert "LOCAL_RANK" not in os.environ
    (tmp_path / "again").mkdir()
    again = write_run_yaml("train_full/qwen3_full_sft.yaml", str(tiny_llama_dir),
                           str(alpaca_file), tmp_path / "again", **FAST,
                           deepspeed=str(DEEPSPEED / ds_config))
    assert main(["train", str(again)]) == 0
    assert "LOCAL_RANK" not in os.environ
