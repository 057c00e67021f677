"""When evaluation runs: every eval_steps, or at every epoch end (eval_strategy: epoch),
once per step at most, never with eval_strategy: no; checked through the CLI."""

from __future__ import annotations

import json

import pytest

from datahelp import alpaca_rows, write_jsonl
from tunesmith.cli.main import main


def _eval_steps(tmp_path, model_dir, *keys: str) -> list[int]:
    train = write_jsonl(tmp_path / "train.jsonl", alpaca_rows(8))
    val = write_jsonl(tmp_path / "val.jsonl", alpaca_rows(2, start=50))
    out = tmp_path / "run"
    assert main(["train", f"model_name_or_path={model_dir}", f"dataset={train}",
                 f"eval_dataset={val}", f"output_dir={out}", "per_device_train_batch_size=4",
                 "num_train_epochs=3", "save_steps=0", "logging_steps=2", *keys]) == 0
    lines = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["step"] for r in lines if "eval_loss" in r]


@pytest.mark.parametrize("keys, expected", [
    (["eval_strategy=epoch"], [2, 4, 6]),  # 8 rows / 4 = 2 steps per epoch
    (["eval_strategy=steps", "eval_steps=4"], [4, 6]),  # and once at the end
    (["eval_strategy=no", "eval_steps=4"], []),
])
def test_evaluation_cadence(tmp_path, tiny_llama_dir, keys, expected):
    assert _eval_steps(tmp_path, tiny_llama_dir, *keys) == expected


def test_yaml_no_is_the_choice_no_not_a_bool(tmp_path):
    from tunesmith.config import load_config

    path = tmp_path / "c.yaml"
    path.write_text("model_name_or_path: m\ndataset: d\neval_strategy: no\n")
    assert load_config(str(path)).training.eval_strategy == "no"  # YAML 1.1 reads `no` as False
