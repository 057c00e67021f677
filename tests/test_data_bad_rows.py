"""Bad input is reported with file, line (or row) and reason; never dropped silently."""

from __future__ import annotations

import json
import re

import pytest

from datahelp import alpaca_rows, prepare, write_jsonl
from tunesmith.errors import DataError

BAD_ALPACA = [
    '{"instruction": "broken", "output": ',  # line 2: malformed JSON
    {"instruction": "no output here"},  # line 3: missing column
    {"instruction": "typed", "output": 42},  # line 4: wrong type
]
BAD_SHAREGPT = [
    {"conversations": []},  # line 1: empty
    {"conversations": [{"from": "gpt", "value": "I start"},
                       {"from": "human", "value": "inverted"}]},  # line 2: role-inverted
    {"conversations": [{"from": "human", "value": "ok"}, {"from": "gpt", "value": "fine"}]},
]


def _alpaca_file(tmp_path):
    return write_jsonl(tmp_path / "bad.jsonl", alpaca_rows(1) + BAD_ALPACA + alpaca_rows(1))


def test_every_bad_row_is_reported_with_its_line(tiny_tokenizer, tmp_path):
    path = _alpaca_file(tmp_path)
    with pytest.raises(DataError) as err:
        prepare(tiny_tokenizer, dataset=[str(path)])
    msg = str(err.value)
    assert msg.startswith("3 bad row(s)")
    assert f"{path}:2: malformed JSON line" in msg
    assert re.search(rf"{path}:3: missing column 'output'", msg)
    assert f"{path}:4: column 'output' is int, expected text" in msg


def test_skip_reports_the_same_rows_and_keeps_the_good_ones(tiny_tokenizer, tmp_path, caplog):
    path = _alpaca_file(tmp_path)
    data = prepare(tiny_tokenizer, dataset=[str(path)], on_bad_row="skip")
    assert len(data.train) == 2
    assert [b.where for b in data.report.bad_rows] == [f"{path}:{n}" for n in (2, 3, 4)]
    assert data.report.summary()["bad_rows"] == 3
    assert "skipped 3 bad row(s)" in caplog.text and f"{path}:2" in caplog.text


def test_empty_and_role_inverted_conversations(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "s.jsonl", BAD_SHAREGPT)
    data = prepare(tiny_tokenizer, dataset=[str(path)], on_bad_row="skip")
    reasons = {b.where: b.reason for b in data.report.bad_rows}
    assert reasons[f"{path}:1"] == "empty conversation"
    assert "first turn is 'assistant'" in reasons[f"{path}:2"]
    assert len(data.train) == 1


def test_over_long_sample_with_truncation_error(tiny_tokenizer, tmp_path):
    rows = alpaca_rows(2) + [{"instruction": "long " * 200, "input": "", "output": "x"}]
    path = write_jsonl(tmp_path / "l.jsonl", rows)
    with pytest.raises(DataError, match=rf"{re.escape(str(path))}:3: sample has \d+ tokens, "
                                        r"more than cutoff_len 64"):
        prepare(tiny_tokenizer, dataset=[str(path)], cutoff_len=64, truncation="error")


def test_bad_rows_in_csv_and_json_name_their_lines(tiny_tokenizer, tmp_path):
    (tmp_path / "a.csv").write_text("instruction,input,output\nq1,,a1\nq2,,a2,extra\n")
    (tmp_path / "b.json").write_text(json.dumps(alpaca_rows(1) + [{"instruction": "q"}],
                                                indent=2))
    data = prepare(tiny_tokenizer, dataset=[str(tmp_path / "a.csv"), str(tmp_path / "b.json")],
                   on_bad_row="skip")
    wheres = [b.where for b in data.report.bad_rows]
    assert wheres[0] == f"{tmp_path / 'a.csv'}:3"
    assert wheres[1].startswith(f"{tmp_path / 'b.json'}:") and wheres[1] != f"{tmp_path}:1"


def test_report_shows_twenty_and_counts_the_rest(tiny_tokenizer, tmp_path):
    path = write_jsonl(tmp_path / "many.jsonl", alpaca_rows(1) + ["{oops"] * 25)
    with pytest.raises(DataError) as err:
        prepare(tiny_tokenizer, dataset=[str(path)])
    msg = str(err.value)
    assert msg.count("malformed JSON line") == 20
    assert "... and 5 more" in msg
    assert msg.startswith("25 bad row(s)")


def test_malformed_whole_json_file_names_the_line(tiny_tokenizer, tmp_path):
    (tmp_path / "x.json").write_text('[\n {"instruction": "a", "output": "b"},\n {oops}\n]')
    with pytest.raises(DataError, match=r"x\.json:3: malformed JSON"):
        prepare(tiny_tokenizer, dataset=[str(tmp_path / "x.json")])
