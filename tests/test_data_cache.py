"""The tokenised cache: hits, invalidation by content, overwrite_cache, tokenized_path,
streaming parity, truncation policies and parallel workers."""

from __future__ import annotations

import numpy as np
import pytest

from datahelp import alpaca_rows, prepare, write_jsonl
from tunesmith.data.pipeline import CHUNK_ROWS


def _same(a, b):
    assert len(a) == len(b)
    for i in range(len(a)):
        assert np.array_equal(a[i].input_ids, b[i].input_ids)
        assert np.array_equal(a[i].labels, b[i].labels)


def test_second_run_loads_from_cache_and_content_changes_invalidate(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(10))
    first = prepare(tiny_tokenizer, dataset=[str(path)])
    again = prepare(tiny_tokenizer, dataset=[str(path)])
    assert (first.report.cache_misses, again.report.cache_hits) == (1, 1)
    _same(first.train, again.train)
    assert again.report.summary()["samples"] == 10  # counts survive the cache
    assert prepare(tiny_tokenizer, dataset=[str(path)], overwrite_cache=True
                   ).report.cache_misses == 1
    assert prepare(tiny_tokenizer, dataset=[str(path)], cutoff_len=512).report.cache_misses == 1
    assert prepare(tiny_tokenizer, dataset=[str(path)], template="llama3"
                   ).report.cache_misses == 1
    write_jsonl(path, alpaca_rows(10, start=1))  # same name, new content
    assert prepare(tiny_tokenizer, dataset=[str(path)]).report.cache_misses == 1


def test_tokenized_path_saves_and_reloads(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(12))
    saved = prepare(tiny_tokenizer, dataset=[str(path)], val_size=2,
                    tokenized_path=str(tmp_path / "tok"))
    path.unlink()  # the reload must not need the source
    loaded = prepare(tiny_tokenizer, dataset=[str(path)], tokenized_path=str(tmp_path / "tok"))
    _same(saved.train, loaded.train)
    _same(saved.val, loaded.val)


def test_parallel_workers_equal_one_process(tiny_tokenizer, tmp_path):
    n = 4 * CHUNK_ROWS + 7  # enough rows to start a pool
    path = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(n))
    one = prepare(tiny_tokenizer, dataset=[str(path)], preprocessing_num_workers=1)
    two = prepare(tiny_tokenizer, dataset=[str(path)], preprocessing_num_workers=2,
                  overwrite_cache=True)
    _same(one.train, two.train)
    assert two.train.source(n - 1) == f"{path}:{n}"


def test_streaming_gives_the_same_samples(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(30))
    whole = prepare(tiny_tokenizer, dataset=[str(path)])
    # streaming is not part of the cache key (it changes no token): encode again to compare
    streamed = prepare(tiny_tokenizer, dataset=[str(path)], streaming=True, overwrite_cache=True)
    assert streamed.report.cache_misses == 1 and streamed.report.cache_hits == 0
    _same(whole.train, streamed.train)


LONG = {"instruction": "word " * 60, "input": "", "output": "The final answer is here."}


@pytest.mark.parametrize("policy", ["truncate_prompt", "drop"])
def test_truncation_policies_are_counted(tiny_tokenizer, tmp_path, policy):
    path = write_jsonl(tmp_path / "a.jsonl", alpaca_rows(3) + [LONG])
    data = prepare(tiny_tokenizer, dataset=[str(path)], cutoff_len=48, truncation=policy)
    summary = data.report.summary()
    if policy == "drop":
        assert len(data.train) == 3 and summary["dropped_too_long"] == 1
    else:
        assert len(data.train) == 4 and summary["truncated_prompt"] == 1
        longest = max(range(4), key=lambda i: len(data.train[i]))
        sample = data.train[longest]
        assert len(sample) == 48
        trained = tiny_tokenizer.decode(sample.input_ids[sample.labels != -100])
        assert "The final answer is here." in trained  # the response survives intact


def test_response_longer_than_cutoff_is_cut_and_counted(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"instruction": "q", "input": "",
                                               "output": "answer " * 80}])
    data = prepare(tiny_tokenizer, dataset=[str(path)], cutoff_len=32)
    assert data.report.summary()["truncated_response"] == 1 and len(data.train[0]) == 32
