"""eval_on_each_dataset (LLaMA-Factory's key) through `tunesmith train`: the loss of each
eval_dataset is logged as eval_<name>_loss, equal to the eval_loss of a run evaluating on
that dataset alone (same seed, same training data: the same weights)."""

from __future__ import annotations

import json

import pytest

from lf_examples import write_run_yaml
from test_lf_example_runs import FAST
from tunesmith.cli.main import main


@pytest.fixture
def data_dir(tmp_path):
    from tiny import write_alpaca

    folder = tmp_path / "data"
    folder.mkdir()
    write_alpaca(folder / "train.json")
    rows = [{"instruction": f"Name a colour number {i}.", "input": "", "output": "Blue."}
            for i in range(5)]
    (folder / "colours.json").write_text(json.dumps(rows))
    write_alpaca(folder / "sums.json", n=7)
    info = {name: {"file_name": f"{name}.json"} for name in ("train", "colours", "sums")}
    (folder / "dataset_info.json").write_text(json.dumps(info))
    return folder


def _eval_records(tmp_path, model, data_dir, name, **keys) -> dict:
    work = tmp_path / name
    work.mkdir()
    path = write_run_yaml("train_lora/qwen3_lora_sft.yaml", str(model), "train", work,
                          **FAST, dataset_dir=str(data_dir), eval_strategy="steps",
                          eval_steps=2, per_device_eval_batch_size=2, **keys)
    assert main(["train", str(path)]) == 0
    records = [json.loads(x) for x in (work / "out" / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_loss" in r]
    assert len(evals) == 1 and evals[0]["step"] == 2
    return evals[0]


def test_each_eval_dataset_gets_its_own_loss(tmp_path, tiny_llama_dir, data_dir):
    both = _eval_records(tmp_path, tiny_llama_dir, data_dir, "both",
                         eval_dataset="colours,sums", eval_on_each_dataset=True)
    alone = {name: _eval_records(tmp_path, tiny_llama_dir, data_dir, name,
                                 eval_dataset=name)["eval_loss"] for name in ("colours", "sums")}
    assert both["eval_colours_loss"] == pytest.approx(alone["colours"], rel=1e-5)
    assert both["eval_sums_loss"] == pytest.approx(alone["sums"], rel=1e-5)
    assert abs(alone["colours"] - alone["sums"]) > 1e-3  # the two sets differ
    low, high = sorted(alone.values())
    assert low < both["eval_loss"] < high  # eval_loss stays the loss over both


def test_eval_on_each_dataset_needs_eval_dataset(tmp_path, tiny_llama_dir, data_dir, capsys):
    path = write_run_yaml("train_lora/qwen3_lora_sft.yaml", str(tiny_llama_dir), "train",
                          tmp_path, **FAST, dataset_dir=str(data_dir), eval_on_each_dataset=True)
    assert main(["train", str(path)]) == 1
    err = capsys.readouterr().err
    assert "eval_on_each_dataset: true needs eval_dataset" in err and f"{path}:" in err
