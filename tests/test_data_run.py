"""The data layer inside a run and on the command line: packing and token-budget batches
train, the summary reports them, the saved tokenizer carries the trained template, and
`tunesmith data inspect` prints the figures and a highlighted sample."""

from __future__ import annotations

import json

import numpy as np
import torch

from datahelp import alpaca_rows, prepare, write_jsonl
from tunesmith.cli.main import main
from tunesmith.config import load_config
from tunesmith.data.batching import collate
from tunesmith.data.loader import LoaderOptions, batch_iterator
from tunesmith.data.template import load_template_source
from tunesmith.recipes.sft import run_sft


def test_packed_run_reports_packing_and_saves_the_trained_template(tmp_path, tiny_llama_dir,
                                                                   tiny_tokenizer):
    data = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(24))
    out = tmp_path / "run"
    cfg = load_config(overrides={
        "model_name_or_path": str(tiny_llama_dir), "dataset": str(data), "template": "chatml",
        "output_dir": str(out), "max_steps": 2, "per_device_train_batch_size": 2,
        "neat_packing": True, "cutoff_len": 256, "logging_steps": 1, "save_steps": 0})
    summary = run_sft(cfg)
    d = summary["data"]
    assert d["packed_samples"] == 24 and d["packed_rows"] < 24
    assert 0.5 < d["packing_efficiency"] <= 1.0
    assert json.loads((out / "run_summary.json").read_text())["data"]["packed_rows"] == \
        d["packed_rows"]
    saved = json.loads((out / "tokenizer_config.json").read_text())
    template = saved.get("chat_template") or (out / "chat_template.jinja").read_text()
    assert template == load_template_source("chatml", tiny_tokenizer)[1]


def test_token_budget_batches_train(tmp_path, tiny_llama_dir, tiny_tokenizer):
    data = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(24))
    lengths = [len(s) for s in prepare(tiny_tokenizer, dataset=[str(data)]).train]
    budget = 4 * max(lengths)  # room for 4 samples a batch, where the batch size says 2

    def steps(*keys: str) -> int:
        out = tmp_path / f"run{len(keys)}"
        assert main(["train", f"model_name_or_path={tiny_llama_dir}", f"dataset={data}",
                     f"output_dir={out}", "num_train_epochs=1", "save_steps=0",
                     "per_device_train_batch_size=2", *keys]) == 0
        return json.loads((out / "run_summary.json").read_text())["steps"]

    assert steps() == 12
    assert steps(f"batch_tokens={budget}") == 6  # the option changed the batches


def test_dataloader_workers_give_the_same_batches(tiny_tokenizer):
    rng = np.random.default_rng(0)
    from tunesmith.data.encode import EncodedSample

    items = [EncodedSample(rng.integers(0, 50, n).astype(np.int32),
                           rng.integers(0, 50, n).astype(np.int32)) for n in range(3, 23)]

    def plan(epoch):
        return [list(range(epoch, 20, 3)), list(range(0, 20, 4))]

    cpu = torch.device("cpu")
    ref = batch_iterator(items, plan, 1, 1, 0, LoaderOptions(), cpu)
    workers = batch_iterator(items, plan, 1, 1, 0, LoaderOptions(num_workers=1), cpu)
    expected = [collate([items[i] for i in idx], 0) for idx in
                plan(1)[1:] + plan(2) + plan(3)[:1]]
    for want in expected:
        a, b = next(ref), next(workers)
        assert torch.equal(a.input_ids, want.input_ids) and torch.equal(b.input_ids,
                                                                        want.input_ids)
        assert torch.equal(b.target_index, want.target_index)


def test_data_inspect_cli(tmp_path, tiny_llama_dir, capsys):
    data = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(10))
    rc = main(["data", "inspect", str(data), "--model", str(tiny_llama_dir), "--color", "never",
               "cutoff_len=64"])
    assert rc == 0
    text = capsys.readouterr().out
    for key in ("samples", "length_p50", "length_p99", "truncated_prompt", "dropped_too_long",
                "packing_efficiency"):
        assert key in text
    shown = text.split("trained tokens in [[ ]]:")[1]
    prompt, answer = shown.split("[[", 1)
    assert "Question 0: what is 0 + 0?" in prompt
    assert answer.startswith("The answer is 0.<|im_end|>\n]]")
