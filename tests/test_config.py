"""Config: YAML + overrides, LLaMA-Factory names, and errors that name key, value and fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from tunesmith.cli.main import main
from tunesmith.config.loader import load_config, parse_cli_args
from tunesmith.errors import ConfigError

EXAMPLES = sorted((Path(__file__).parents[1] / "examples").rglob("*.yaml"))


def test_yaml_and_overrides(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("model_name_or_path: m\nlearning_rate: 1.0e-4\nlora_target: q_proj,v_proj\n"
                        "resume_from_checkpoint: null\nbf16: true\n")
    path, overrides = parse_cli_args([str(cfg_file), "lora_rank=4", "--learning_rate", "2e-4",
                                      "--fp16=false", "--gradient_checkpointing", "true"])
    cfg = load_config(path, overrides)
    assert cfg.training.learning_rate == 2e-4  # command line wins over the file
    assert cfg.finetuning.lora_rank == 4
    assert cfg.finetuning.lora_target == ["q_proj", "v_proj"]
    assert cfg.training.bf16 is True and cfg.training.fp16 is False
    assert cfg.training.gradient_checkpointing == "true"
    assert cfg.training.resume_from_checkpoint == ""  # null keeps the default


def test_flags_alone_without_yaml():
    path, overrides = parse_cli_args(["--model_name_or_path", "m", "--bf16", "--max_steps", "3"])
    cfg = load_config(path, overrides)
    assert path is None and cfg.training.bf16 and cfg.training.max_steps == 3


def test_all_problems_reported_at_once_with_location(tmp_path):
    cfg_file = tmp_path / "bad.yaml"
    cfg_file.write_text("model_name_or_path: m\nlearnig_rate: 1e-4\nlora_rank: -2\n"
                        "train_from_scratch: true\nlr_scheduler_type: cosin\n")
    with pytest.raises(ConfigError) as err:
        load_config(cfg_file)
    text = str(err.value)
    assert "4 configuration errors" in text
    assert "unknown key 'learnig_rate'" in text and "did you mean learning_rate" in text
    assert f"{cfg_file}:2" in text
    assert "lora_rank: -2 is out of range; it must be >= 1" in text and f"{cfg_file}:3" in text
    assert "train_from_scratch: this LLaMA-Factory key is not supported by tunesmith yet" in text
    assert "did you mean cosine" in text


@pytest.mark.parametrize("key,value,expected", [
    ("learning_rate", -1.0, "learning_rate: -1.0 is out of range; it must be > 0"),
    ("learning_rate", "fast", "expected a number, got 'fast'"),
    ("bf16", "maybe", "expected true or false"),
    ("finetuning_type", "qlora", "'qlora' is not one of lora, oft, freeze, full"),
    ("warmup_ratio", 1.5, "warmup_ratio: 1.5 is out of range; it must be <= 1"),
    ("val_size", 2.5, "must be a fraction below 1 or a whole count"),
])
def test_bad_values(key, value, expected):
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"model_name_or_path": "m", key: value})
    assert expected in str(err.value)
    assert key in str(err.value)


def test_bf16_and_fp16_conflict():
    with pytest.raises(ConfigError, match="bf16 and fp16 are both true"):
        load_config(overrides={"bf16": True, "fp16": True})


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", EXAMPLES, ids=[p.name for p in EXAMPLES])
def test_every_example_yaml_validates(path):
    load_config(path)


def test_cli_reports_config_error_without_traceback(tmp_path, capsys):
    code = main(["train", "--model_name_or_path", "m", "--lerning_rate", "1"])
    assert code == 1
    err = capsys.readouterr().err
    assert "did you mean learning_rate" in err and "Traceback" not in err


def test_output_dir_never_overwritten_silently(tmp_path, tiny_llama_dir, alpaca_file, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "precious.txt").write_text("keep me")
    code = main(["train", "--model_name_or_path", str(tiny_llama_dir), "--dataset",
                 str(alpaca_file), "--output_dir", str(out), "--max_steps", "1"])
    assert code == 1
    assert "exists and is not empty" in capsys.readouterr().err
    assert (out / "precious.txt").read_text() == "keep me"


def test_unknown_model_reference_is_explained(tmp_path, alpaca_file, capsys):
    code = main(["train", "--model_name_or_path", "not-a-model", "--dataset", str(alpaca_file),
                 "--output_dir", str(tmp_path / "o"), "--max_steps", "1"])
    assert code == 1
    err = capsys.readouterr().err
    assert "'not-a-model' is not a built-in alias (smollm2-135m-instruct)" in err


def test_train_help_lists_every_key(capsys):
    assert main(["train", "--help"]) == 0
    out = capsys.readouterr().out
    for key in ("model_name_or_path", "lora_rank", "gradient_accumulation_steps", "trust_remote_code"):
        assert key in out


def test_env_report(capsys):
    assert main(["env"]) == 0
    out = capsys.readouterr().out
    for name in ("tunesmith", "python", "torch", "transformers", "peft"):
        assert name in out
