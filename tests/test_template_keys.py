"""LLaMA-Factory template names inside tunesmith's data path and CLI: tool calls trained,
tool results masked; enable_thinking, default_system and tool_format; empty answers are
bad rows; a template needing tokens the model lacks is refused."""

from __future__ import annotations

import json

import pytest

from datahelp import write_jsonl
from tunesmith.cli.main import main
from tunesmith.config.template_section import TemplateConfig
from tunesmith.data.loading import DataContext, prepare_data
from tunesmith.data.slot_renderer import SlotRenderer, make_renderer
from tunesmith.data.template import load_template_source
from tunesmith.errors import ConfigError, DataError

CALL = {"name": "get_weather", "arguments": {"city": "Paris"}}
TOOLS = [{"name": "get_weather", "description": "Weather of a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
GLAIVE_ROW = {"conversations": [
    {"from": "human", "value": "Weather in Paris?"},
    {"from": "function_call", "value": json.dumps(CALL)},
    {"from": "observation", "value": "RESULT 21 degrees"},
    {"from": "gpt", "value": "It is 21 degrees."}], "tools": json.dumps(TOOLS)}


def write_info(folder, rows, formatting="sharegpt"):
    write_jsonl(folder / "d.jsonl", rows)
    info = {"d": {"file_name": "d.jsonl", "formatting": formatting}}
    if formatting == "sharegpt":
        info["d"]["columns"] = {"messages": "conversations", "tools": "tools"}
    (folder / "dataset_info.json").write_text(json.dumps(info))


def prepare(tokenizer, folder, template="qwen", on_bad_row="error", **keys):
    from tunesmith.config.schema import DataConfig

    name, source = load_template_source(template, tokenizer)
    renderer = make_renderer(name, source, tokenizer, TemplateConfig(**keys))
    cfg = DataConfig(dataset=["d"], dataset_dir=str(folder), preprocessing_num_workers=1,
                     on_bad_row=on_bad_row)
    return renderer, prepare_data(cfg, DataContext(renderer, tokenizer, 42, "sft"))


def trained_text(tokenizer, data) -> tuple[str, str]:
    s = data.train[0]
    mask = s.labels != -100
    return tokenizer.decode(s.input_ids[mask]), tokenizer.decode(s.input_ids[~mask])


def test_tool_call_trained_and_tool_result_masked(tmp_path, tiny_tokenizer):
    write_info(tmp_path, [GLAIVE_ROW])
    renderer, data = prepare(tiny_tokenizer, tmp_path, "qwen")
    assert isinstance(renderer, SlotRenderer)
    trained, prompt = trained_text(tiny_tokenizer, data)
    assert '"name": "get_weather"' in trained and "It is 21 degrees." in trained
    assert "RESULT 21 degrees" in prompt and "RESULT" not in trained
    assert "# Tools" in prompt  # qwen's tool prompt in the system turn


def test_tool_format_and_default_system_keys(tmp_path, tiny_tokenizer):
    write_info(tmp_path, [GLAIVE_ROW])
    _, data = prepare(tiny_tokenizer, tmp_path, "qwen", tool_format="default",
                      default_system="Be brief.")
    trained, prompt = trained_text(tiny_tokenizer, data)
    assert "Action: get_weather" in trained and "Action Input:" in trained
    assert "Be brief." in prompt and "# Tools" not in prompt
    with pytest.raises(ConfigError, match="unknown tool format 'qwn'.*did you mean qwen"):
        make_renderer("qwen", "", tiny_tokenizer, TemplateConfig(tool_format="qwn"))


@pytest.mark.parametrize("thinking", [True, False])
def test_enable_thinking_decides_where_the_empty_thought_goes(tmp_path, tiny_tokenizer,
                                                              thinking):
    write_info(tmp_path, [{"instruction": "Is 7 prime?", "output": "Yes."}], "alpaca")
    _, data = prepare(tiny_tokenizer, tmp_path, "qwen3", enable_thinking=thinking)
    trained, prompt = trained_text(tiny_tokenizer, data)
    assert ("<think>" in trained) is thinking and ("<think>" in prompt) is not thinking
    assert "Yes." in trained


def test_empty_answer_is_a_bad_row_with_its_line(tmp_path, tiny_tokenizer):
    rows = [{"instruction": "Q1", "output": "A1"}, {"instruction": "Q2", "output": ""}]
    write_info(tmp_path, rows, "alpaca")
    with pytest.raises(DataError, match=r"d\.jsonl:2.*answer is empty"):
        prepare(tiny_tokenizer, tmp_path, "qwen")
    _, data = prepare(tiny_tokenizer, tmp_path, "qwen", on_bad_row="skip")
    assert len(data.train) == 1 and len(data.report.bad_rows) == 1


def test_template_keys_through_the_cli(tmp_path, tiny_llama_dir, capsys):
    write_info(tmp_path, [GLAIVE_ROW] * 4)
    cfg = {"model_name_or_path": str(tiny_llama_dir), "dataset": "d",
           "dataset_dir": str(tmp_path), "template": "qwen3", "enable_thinking": False,
           "default_system": "Be brief.", "tool_format": "qwen", "max_steps": 1,
           "output_dir": str(tmp_path / "run"), "save_steps": 0, "cutoff_len": 512,
           "preprocessing_batch_size": 3, "buffer_size": 128, "media_dir": str(tmp_path)}
    (tmp_path / "run.yaml").write_text("\n".join(f"{k}: {json.dumps(v)}"
                                                 for k, v in cfg.items()))
    assert main(["train", str(tmp_path / "run.yaml")]) in (0, None)
    resolved = (tmp_path / "run" / "config.resolved.yaml").read_text()
    assert "enable_thinking: false" in resolved and "tool_format: qwen" in resolved


def test_template_needing_missing_tokens_is_refused(tmp_path, tiny_llama_dir, capsys):
    write_info(tmp_path, [{"instruction": "Q", "output": "A"}] * 2, "alpaca")
    cfg = ["train", f"model_name_or_path={tiny_llama_dir}", "dataset=d",
           f"dataset_dir={tmp_path}", "template=llama3", "max_steps=1",
           f"output_dir={tmp_path / 'run'}", "save_steps=0"]
    assert main(cfg) != 0
    assert "'llama3' needs the token(s) <|eot_id|>" in capsys.readouterr().err


def test_efficient_eos_labels_survive_the_store(tmp_path, tiny_tokenizer):
    """glm4 ends an answer by predicting EOS where the next prompt starts: that label is
    not the token itself, and the on-disk store must keep it."""
    from tunesmith.data.slot_encode import SampleOptions, build_sample, to_turns
    from tunesmith.data.store import SampleStore

    row = {"conversations": [{"from": "human", "value": "Q1"}, {"from": "gpt", "value": "A1"},
                             {"from": "human", "value": "Q2"}, {"from": "gpt", "value": "A2"}]}
    write_info(tmp_path, [row])
    renderer, data = prepare(tiny_tokenizer, tmp_path, "glm4")
    sample = data.train[0]
    eos = tiny_tokenizer.eos_token_id
    odd = (sample.labels != -100) & (sample.labels != sample.input_ids)
    assert odd.sum() == 1 and sample.labels[odd][0] == eos
    from tunesmith.data.formats import FormatSpec, convert_sharegpt

    conv = convert_sharegpt(row, FormatSpec("sharegpt", {"messages": "conversations"}))
    pairs = renderer.encoder.encode_pairs([to_turns(conv)])[0]
    _, labels, _ = build_sample(pairs, SampleOptions(4096, efficient_eos=True, eos_id=eos))
    assert sample.labels.tolist() == labels.tolist()
    SampleStore.from_samples([sample]).save(tmp_path / "copy")
    assert SampleStore.open(tmp_path / "copy")[0].labels.tolist() == labels.tolist()


def test_preprocessing_batch_size_sets_the_chunk_rows(tmp_path, tiny_tokenizer, monkeypatch):
    from tunesmith.config.schema import DataConfig
    from tunesmith.data import pipeline

    calls = []
    real = pipeline._encode_chunk_in_worker
    monkeypatch.setattr(pipeline, "_encode_chunk_in_worker",
                        lambda rows: calls.append(len(rows)) or real(rows))
    write_info(tmp_path, [{"instruction": f"Q{i}", "output": "A"} for i in range(10)], "alpaca")
    name, source = load_template_source("qwen", tiny_tokenizer)
    ctx = DataContext(make_renderer(name, source, tiny_tokenizer), tiny_tokenizer, 42, "sft")
    cfg = DataConfig(dataset=["d"], dataset_dir=str(tmp_path), preprocessing_num_workers=1,
                     preprocessing_batch_size=4)
    assert len(prepare_data(cfg, ctx).train) == 10 and calls == [4, 4, 2]
