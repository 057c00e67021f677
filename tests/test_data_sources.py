"""Registry, file types and formats: every source converts into the same samples."""

from __future__ import annotations

import csv
import json

import pytest

from datahelp import alpaca_rows, decoded_samples, prepare, write_jsonl
from tunesmith.data.conversation import Message
from tunesmith.data.formats import CONVERTERS, FormatSpec
from tunesmith.errors import DataError


def _write_all_types(folder, rows):
    (folder / "a.json").write_text(json.dumps(rows, indent=1))
    write_jsonl(folder / "a.jsonl", rows)
    with open(folder / "a.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    import datasets

    ds = datasets.Dataset.from_list(rows)
    ds.to_parquet(str(folder / "a.parquet"))
    ds.save_to_disk(str(folder / "saved"))
    datasets.DatasetDict({"train": ds, "test": ds.select(range(2))}).save_to_disk(
        str(folder / "saved_dict"))


@pytest.mark.parametrize("name", ["a.json", "a.jsonl", "a.csv", "a.parquet", "saved",
                                  "saved_dict"])
def test_every_file_type_gives_the_same_samples(tiny_tokenizer, tmp_path, name):
    rows = alpaca_rows(6)
    _write_all_types(tmp_path, rows)
    data = prepare(tiny_tokenizer, dataset=[str(tmp_path / name)], cutoff_len=256)
    reference = prepare(tiny_tokenizer, dataset=[str(tmp_path / "a.json")], cutoff_len=256)
    assert len(data.train) == 6
    assert decoded_samples(tiny_tokenizer, data) == decoded_samples(tiny_tokenizer, reference)


def test_dataset_info_entry_with_columns_split_and_num_samples(tiny_tokenizer, tmp_path):
    rows = [{"q": f"Question {i}?", "a": f"Answer {i}.", "sys": "Be kind."} for i in range(5)]
    import datasets

    datasets.DatasetDict({"validation": datasets.Dataset.from_list(rows)}).save_to_disk(
        str(tmp_path / "d"))
    info = {"mine": {"file_name": "d", "split": "validation", "num_samples": 8,
                     "columns": {"prompt": "q", "response": "a", "system": "sys"}}}
    (tmp_path / "dataset_info.json").write_text(json.dumps(info))
    data = prepare(tiny_tokenizer, dataset=["mine"], dataset_dir=str(tmp_path), cutoff_len=256)
    assert len(data.train) == 8  # num_samples over-samples 5 rows to 8
    text = decoded_samples(tiny_tokenizer, data)[0]
    assert "<|im_start|>system\nBe kind.<|im_end|>" in text


def test_glob_and_folder_sources(tiny_tokenizer, tmp_path):
    folder = tmp_path / "data"
    folder.mkdir()
    write_jsonl(folder / "p1.jsonl", alpaca_rows(3))
    write_jsonl(folder / "p2.jsonl", alpaca_rows(4, start=3))
    assert len(prepare(tiny_tokenizer, dataset=[str(folder / "p*.jsonl")]).train) == 7
    assert len(prepare(tiny_tokenizer, dataset=[str(folder)]).train) == 7


def test_hub_dataset_without_network_is_a_clear_error(tiny_tokenizer, tmp_path):
    with pytest.raises(DataError, match="hub is offline"):
        prepare(tiny_tokenizer, dataset=["someorg/somedata"], dataset_dir=str(tmp_path))


def test_unknown_dataset_name_suggests(tiny_tokenizer, tmp_path):
    (tmp_path / "dataset_info.json").write_text(json.dumps({"alpaca_en": {"file_name": "x"}}))
    with pytest.raises(DataError, match="did you mean alpaca_en"):
        prepare(tiny_tokenizer, dataset=["alpaca_em"], dataset_dir=str(tmp_path))


def test_sharegpt_with_tags_system_tools_and_function_call():
    spec = FormatSpec("sharegpt", {"messages": "conv", "system": "sys", "tools": "tools"},
                      {"role_tag": "role", "content_tag": "text", "user_tag": "u",
                       "assistant_tag": "a", "function_tag": "fc", "observation_tag": "obs"})
    row = {"sys": "Be brief.", "tools": json.dumps([{"name": "f"}]), "conv": [
        {"role": "u", "text": "Call f"},
        {"role": "fc", "text": json.dumps({"name": "f", "arguments": {"x": 1}})},
        {"role": "obs", "text": "42"}, {"role": "a", "text": "Got 42."}]}
    conv = CONVERTERS["sharegpt"](row, spec)
    assert [m.role for m in conv.messages] == ["system", "user", "assistant", "tool",
                                               "assistant"]
    assert conv.messages[2].tool_calls[0]["function"] == {"name": "f", "arguments": {"x": 1}}
    assert conv.tools == [{"name": "f"}]


def test_openai_messages_with_tool_calls():
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    row = {"messages": [{"role": "user", "content": "hi"},
                        {"role": "assistant", "content": None, "tool_calls": [call]},
                        {"role": "tool", "content": "ok"},
                        {"role": "assistant", "content": "done"}]}
    conv = CONVERTERS["openai"](row, FormatSpec("openai"))
    assert conv.messages[1] == Message("assistant", "", [call])


def test_preference_pairs_alpaca_and_sharegpt():
    spec = FormatSpec("alpaca", ranking=True)
    conv = CONVERTERS["alpaca"]({"instruction": "Pick", "chosen": "good", "rejected": "bad"},
                                spec)
    assert conv.messages[-1] == Message("assistant", "good")
    assert conv.rejected == Message("assistant", "bad")
    spec = FormatSpec("sharegpt", ranking=True)
    conv = CONVERTERS["sharegpt"]({"conversations": [{"from": "human", "value": "Pick"}],
                                   "chosen": {"from": "gpt", "value": "good"},
                                   "rejected": {"from": "gpt", "value": "bad"}}, spec)
    assert conv.messages[-1].content == "good" and conv.rejected.content == "bad"


def test_preference_dataset_in_sft_is_refused(tiny_tokenizer, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"instruction": "a", "chosen": "b", "rejected": "c"}])
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"pref": {"file_name": "p.jsonl", "ranking": True}}))
    with pytest.raises(DataError, match="preference pairs"):
        prepare(tiny_tokenizer, dataset=["pref"], dataset_dir=str(tmp_path))


def test_plain_text_for_pretraining_splits_long_texts(tiny_tokenizer, tmp_path):
    write_jsonl(tmp_path / "t.jsonl", [{"text": "hello world " * 40}, {"text": "short one"}])
    data = prepare(tiny_tokenizer, stage="pt", dataset=[str(tmp_path / "t.jsonl")],
                   cutoff_len=32)
    lengths = [len(data.train[i]) for i in range(len(data.train))]
    assert max(lengths) <= 32 and len(lengths) > 2
    assert data.report.encode.split_texts == 1
    ends = [tiny_tokenizer.decode(data.train[i].input_ids) for i in range(len(data.train))]
    assert any(t.endswith("short one<|im_end|>") for t in ends)
    assert all((data.train[i].labels != -100).all() for i in range(len(data.train)))


@pytest.mark.parametrize("strategy,expected", [("concat", 7), ("interleave_under", 6),
                                               ("interleave_over", 8)])
def test_mix_strategies(tiny_tokenizer, tmp_path, strategy, expected):
    write_jsonl(tmp_path / "a.jsonl", alpaca_rows(3))
    write_jsonl(tmp_path / "b.jsonl", alpaca_rows(4, start=10))
    data = prepare(tiny_tokenizer, dataset=[str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")],
                   mix_strategy=strategy)
    # under: a b a b a b, then a is out | over: ... then a (again) b, until both are used
    assert len(data.train) == expected


def test_interleave_probs_and_bad_probs(tiny_tokenizer, tmp_path):
    from tunesmith.errors import ConfigError

    write_jsonl(tmp_path / "a.jsonl", alpaca_rows(20))
    write_jsonl(tmp_path / "b.jsonl", alpaca_rows(20, start=50))
    files = [str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    data = prepare(tiny_tokenizer, dataset=files, mix_strategy="interleave_over",
                   interleave_probs=["0.9", "0.1"])
    texts = decoded_samples(tiny_tokenizer, data)
    from_b = sum("Question 5" in t or "Question 6" in t for t in texts)
    assert from_b >= 20 and len(texts) - from_b > 2 * from_b  # b used once, a much more
    with pytest.raises(ConfigError, match="interleave_probs"):
        prepare(tiny_tokenizer, dataset=files, mix_strategy="interleave_under",
                interleave_probs=["0.5", "0.2"])


def test_max_samples_and_val_size(tiny_tokenizer, tmp_path):
    write_jsonl(tmp_path / "a.jsonl", alpaca_rows(20))
    f = [str(tmp_path / "a.jsonl")]
    assert len(prepare(tiny_tokenizer, dataset=f, max_samples=5).train) == 5
    d = prepare(tiny_tokenizer, dataset=f, val_size=0.25)
    assert (len(d.train), len(d.val)) == (15, 5)
    d = prepare(tiny_tokenizer, dataset=f, val_size=3)
    assert (len(d.train), len(d.val)) == (17, 3)
    assert not set(decoded_samples(tiny_tokenizer, d)) & {
        tiny_tokenizer.decode(d.val[i].input_ids) for i in range(3)}


def test_sharegpt_openai_and_text_files_through_dataset_info(tiny_tokenizer, tmp_path):
    write_jsonl(tmp_path / "sg.jsonl", [{"system": "Be kind.", "conversations": [
        {"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello friend"}]}])
    write_jsonl(tmp_path / "oa.jsonl", [{"messages": [
        {"role": "user", "content": "Ping"}, {"role": "assistant", "content": "Pong"}]}])
    (tmp_path / "dataset_info.json").write_text(json.dumps({
        "sg": {"file_name": "sg.jsonl", "formatting": "sharegpt"},
        "oa": {"file_name": "oa.jsonl", "formatting": "sharegpt",
               "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                        "assistant_tag": "assistant"}, "columns": {"messages": "messages"}}}))
    data = prepare(tiny_tokenizer, dataset=["sg", "oa"], dataset_dir=str(tmp_path))
    texts = decoded_samples(tiny_tokenizer, data)
    assert texts[0] == ("<|im_start|>system\nBe kind.<|im_end|>\n<|im_start|>user\nHi there"
                        "<|im_end|>\n<|im_start|>assistant\nHello friend<|im_end|>\n")
    assert "<|im_start|>assistant\nPong<|im_end|>" in texts[1]
    auto = prepare(tiny_tokenizer, dataset=[str(tmp_path / "oa.jsonl")])  # detected: openai
    assert decoded_samples(tiny_tokenizer, auto) == [texts[1]]
