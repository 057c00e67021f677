"""A text-only model given rows with images or videos stops with file:line (LLaMA-Factory
drops the media silently and trains `<image>` as text)."""

from __future__ import annotations

import pytest
import yaml

from datahelp import prepare, write_jsonl
from tunesmith.cli.main import main

MEDIA_ROW = {"messages": [{"role": "user", "content": "<image>Who is this?"},
                          {"role": "assistant", "content": "A player."}],
             "images": ["pics/1.jpg"]}


def test_text_model_refuses_media_rows_through_the_cli(tmp_path, tiny_llama_dir, capsys):
    data = write_jsonl(tmp_path / "mm.jsonl", [{"messages": MEDIA_ROW["messages"]}, MEDIA_ROW])
    cfg = tmp_path / "train.yaml"
    cfg.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_llama_dir),
                                   "dataset": str(data), "template": "chatml",
                                   "output_dir": str(tmp_path / "out"), "max_steps": 1}))
    rc = main(["train", str(cfg)])
    err = capsys.readouterr().err
    assert rc != 0
    assert f"{data}:2: the row has 1 image(s)" in err
    assert "text-only" in err and f"{data}:1" not in err


@pytest.mark.parametrize("column", ["images", "videos"])
def test_skip_counts_media_rows_as_bad(tiny_tokenizer, tmp_path, column):
    row = {"messages": MEDIA_ROW["messages"], column: ["x.mp4" if column == "videos" else "a.jpg"]}
    path = write_jsonl(tmp_path / "mm.jsonl", [row, {"messages": MEDIA_ROW["messages"]}])
    data = prepare(tiny_tokenizer, dataset=[str(path)], on_bad_row="skip")
    assert len(data.train) == 1
    assert [b.where for b in data.report.bad_rows] == [f"{path}:1"]
    kind = "video(s)" if column == "videos" else "image(s)"
    assert f"1 {kind}" in data.report.bad_rows[0].reason
