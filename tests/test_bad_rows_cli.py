"""Bad rows through the real CLI: a chunk whose every row is bad ends in the bad-row report
(never a crash inside the tokenizer), and a report names the file the user gave even when
the tokenised cache was filled from a copy of it elsewhere."""

from __future__ import annotations

import shutil

from datahelp import alpaca_rows, prepare, write_jsonl
from tunesmith.cli.main import main


def _train(tmp_path, model_dir, data, *extra: str) -> int:
    return main(["train", f"model_name_or_path={model_dir}", f"dataset={data}",
                 f"output_dir={tmp_path / 'run'}", "max_steps=2", "save_steps=0",
                 "per_device_train_batch_size=2", *extra])


def test_pt_on_rows_without_text_gives_the_report(tmp_path, tiny_llama_dir, capsys):
    data = write_jsonl(tmp_path / "alpaca.jsonl", alpaca_rows(5))  # no `text` column
    assert _train(tmp_path, tiny_llama_dir, data, "stage=pt") == 1
    err = capsys.readouterr().err
    assert err.startswith("error: 5 bad row(s)")
    assert f"{data}:1: missing column 'text'" in err


def test_pt_skip_with_every_row_bad_says_nothing_is_left(tmp_path, tiny_llama_dir, capsys):
    data = write_jsonl(tmp_path / "alpaca.jsonl", alpaca_rows(5))
    assert _train(tmp_path, tiny_llama_dir, data, "stage=pt", "on_bad_row=skip") == 1
    assert "no usable samples" in capsys.readouterr().err


def test_pt_trains_when_only_some_rows_are_bad(tmp_path, tiny_llama_dir, caplog):
    rows = [{"text": f"Plain text number {i} for pre-training."} for i in range(6)]
    data = write_jsonl(tmp_path / "t.jsonl", rows + [{"title": "no text"}])
    assert _train(tmp_path, tiny_llama_dir, data, "stage=pt", "on_bad_row=skip") == 0
    assert f"{data}:7" in caplog.text
    assert (tmp_path / "run" / "adapter_model.safetensors").is_file()


def test_report_names_the_users_file_after_a_copy_filled_the_cache(tiny_tokenizer, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    src = write_jsonl(first / "d.jsonl", alpaca_rows(2) + [{"instruction": "no output"}])
    copy = second / "d.jsonl"
    shutil.copy(src, copy)
    filled = prepare(tiny_tokenizer, dataset=[str(src)], on_bad_row="skip")
    again = prepare(tiny_tokenizer, dataset=[str(copy)], on_bad_row="skip")
    assert again.report.cache_hits == 1  # same content: the cache is shared
    assert [b.where for b in filled.report.bad_rows] == [f"{src}:3"]
    assert [b.where for b in again.report.bad_rows] == [f"{copy}:3"]
    assert again.train.source(0) == f"{copy}:1"  # sample locations follow the copy too


def test_relocate_rewrites_only_whole_file_prefixes():
    from tunesmith.data.relocate import location_map, relocate

    moved = location_map(["/a/d.parquet", "/a/same.jsonl"], ["/b/d.parquet", "/a/same.jsonl"])
    assert moved == {"/a/d.parquet": "/b/d.parquet"}
    assert relocate("/a/d.parquet[row 4]", moved) == "/b/d.parquet[row 4]"
    assert relocate("/a/d.parquet:3 (part 2)", moved) == "/b/d.parquet:3 (part 2)"
    assert relocate("/a/d.parquet2:3", moved) == "/a/d.parquet2:3"  # another file
    assert location_map(["/a/x"], ["/b/x", "/b/y"]) == {}
