"""LLaMA-Factory's data folder (dataset_info.json unchanged, demo files cut short) loads,
each dataset for its stage; preference and KTO data and hub entries fail with the reason."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tunesmith.config.schema import DataConfig
from tunesmith.data.loading import DataContext, prepare_data
from tunesmith.data.slot_renderer import make_renderer
from tunesmith.data.template import load_template_source
from tunesmith.errors import DataError

LF_DATA = Path(__file__).parent / "fixtures" / "llamafactory_data"


def prepare(tokenizer, dataset: str, stage: str = "sft", template: str = "qwen", **keys):
    name, source = load_template_source(template, tokenizer)
    ctx = DataContext(make_renderer(name, source, tokenizer), tokenizer, 42, stage)
    cfg = DataConfig(dataset=[dataset], dataset_dir=str(LF_DATA), preprocessing_num_workers=1,
                     cutoff_len=1024, **keys)
    return prepare_data(cfg, ctx)


@pytest.mark.parametrize("dataset", ["alpaca_en_demo", "alpaca_zh_demo", "identity",
                                     "glaive_toolcall_en_demo", "glaive_toolcall_zh_demo"])
def test_sft_datasets_load(tiny_tokenizer, dataset):
    keys = {"dataset_vars": {"name": "Tuney", "author": "Ada"}} if dataset == "identity" else {}
    data = prepare(tiny_tokenizer, dataset, **keys)
    assert len(data.train) == 8 and not data.report.bad_rows


@pytest.mark.parametrize("dataset", ["wiki_demo", "c4_demo"])
def test_pretraining_datasets_load(tiny_tokenizer, dataset):
    data = prepare(tiny_tokenizer, dataset, stage="pt")
    assert len(data.train) >= 8 and not data.report.bad_rows
    assert all((s.labels != -100).all() for s in data.train)


@pytest.mark.parametrize("dataset, stage_word", [("dpo_en_demo", "preference"),
                                                ("dpo_zh_demo", "preference"),
                                                ("kto_en_demo", "stage: kto")])
def test_preference_and_kto_data_name_their_stage(tiny_tokenizer, dataset, stage_word):
    with pytest.raises(DataError, match=stage_word):
        prepare(tiny_tokenizer, dataset)


def test_hub_entry_offline_says_so(tiny_tokenizer):
    with pytest.raises(DataError, match="alpaca_gpt4.*hub is offline"):
        prepare(tiny_tokenizer, "alpaca_gpt4_en")


def test_txt_and_arrow_files(tmp_path, tiny_tokenizer):
    pa = pytest.importorskip("pyarrow")
    shutil.copy(LF_DATA / "wiki_demo.txt", tmp_path / "wiki.txt")
    (tmp_path / "blank.txt").write_text("first line\n\nthird line\n", encoding="utf-8")
    table = pa.table({"instruction": ["Q1", "Q2"], "output": ["A1", "A2"]})
    with pa.ipc.new_stream(str(tmp_path / "d.arrow"), table.schema) as writer:
        writer.write_table(table)
    name, source = load_template_source("qwen", tiny_tokenizer)
    ctx = DataContext(make_renderer(name, source, tiny_tokenizer), tiny_tokenizer, 42, "pt")
    data = prepare_data(DataConfig(dataset=[str(tmp_path / "wiki.txt")],
                                   preprocessing_num_workers=1), ctx)
    assert len(data.train) >= 8
    with pytest.raises(DataError, match=r"blank\.txt:2.*empty text"):
        prepare_data(DataConfig(dataset=[str(tmp_path / "blank.txt")],
                                preprocessing_num_workers=1), ctx)
    ctx.stage = "sft"
    data = prepare_data(DataConfig(dataset=[str(tmp_path / "d.arrow")],
                                   preprocessing_num_workers=1), ctx)
    assert len(data.train) == 2
