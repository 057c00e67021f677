"""Tests written for mutants that survived tools/mutation.py (docs/reliability.md): each
checks a behaviour no other test pinned down."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from datahelp import alpaca_rows, prepare, write_jsonl
from tunesmith.data.encode import EncodedSample
from tunesmith.data.packing import PackedSamples
from tunesmith.errors import DataError


def _sample(n: int) -> EncodedSample:
    ids = np.arange(n, dtype=np.int32)
    return EncodedSample(ids, ids.copy())


def test_packed_samples_slice_and_stats():
    samples = [_sample(n) for n in (5, 4, 3, 2)]
    packed = PackedSamples(samples, np.array([5, 4, 3, 2]), 6)  # rows: 5 | 4+2 | 3
    assert [len(r) for r in packed[0:2]] == [len(packed[0]), len(packed[1])]
    assert len(packed[:]) == len(packed) == 3
    stats = packed.stats()
    assert stats == {"packed_rows": 3, "packed_samples": 4, "samples_per_row": 1.333,
                     "packing_efficiency": 0.7778}
    one_row = PackedSamples(samples[2:], np.array([3, 2]), 6)
    assert one_row.stats()["samples_per_row"] == 2.0


def test_nonfinite_step_is_logged_with_its_values(tmp_path, tiny_llama_dir, tiny_tokenizer,
                                                  caplog):
    from test_training import _samples, _trainer

    trainer, _ = _trainer(tmp_path, tiny_llama_dir, _samples(tiny_tokenizer, 4), max_steps=2,
                          per_device_train_batch_size=2)
    real = trainer.objective.loss_sum
    trainer.objective.loss_sum = lambda m, b: real(m, b) * float("nan")
    with caplog.at_level(logging.WARNING):
        trainer.run()
    records = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    skipped = [r for r in records if r.get("skipped_nonfinite")]
    assert [r["step"] for r in skipped] == [1, 2] and all(r["skipped_nonfinite"] is True
                                                         for r in skipped)
    assert math.isnan(skipped[0]["loss_raw"])
    assert "non-finite loss nan / grad norm nan" in caplog.text


def test_dataset_info_errors_and_text_column(tiny_tokenizer, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "t.jsonl", [{"body": f"Plain text {i}."} for i in range(3)])
    info = {"bad": {"file_name": "t.jsonl", "colums": {}},
            "tagged": {"file_name": "t.jsonl", "tags": ["role"]},
            "plain": {"file_name": "t.jsonl", "columns": {"text": "body"}}}
    (folder / "dataset_info.json").write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"unknown key\(s\) colums; known keys are .*columns"):
        prepare(tiny_tokenizer, dataset=["bad"], dataset_dir=str(folder))
    with pytest.raises(DataError, match="tags must be an object"):
        prepare(tiny_tokenizer, dataset=["tagged"], dataset_dir=str(folder))
    data = prepare(tiny_tokenizer, dataset=["plain"], dataset_dir=str(folder), stage="pt")
    assert len(data.train) == 3 and not data.report.bad_rows  # `text` mapped to `body`


def test_tokenized_path_keeps_sample_locations(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(3))
    prepare(tiny_tokenizer, dataset=[str(path)], tokenized_path=str(tmp_path / "tok"))
    loaded = prepare(tiny_tokenizer, dataset=[str(path)], tokenized_path=str(tmp_path / "tok"))
    assert sorted(loaded.train.source(i) for i in range(3)) == [f"{path}:{n}" for n in (1, 2, 3)]
