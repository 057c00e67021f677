"""Every LLaMA-Factory template name encodes exactly as LLaMA-Factory itself encodes it.

The fixtures (tests/fixtures/templates/, written by tools/lf_fixtures.py running
LLaMA-Factory in a side environment) hold input ids and label masks for a few
conversations per template, with a byte-level BPE and a SentencePiece-style tokenizer.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

import pytest

from tunesmith.data.slot_encode import SampleOptions, SlotEncoder, Turns, build_sample
from tunesmith.data.slot_template import fix_tokenizer, load_slot_template, slot_template_names

FIXTURES = Path(__file__).parent / "fixtures" / "templates"
LF_NAMES_0_9_5 = 121  # LLaMA-Factory 0.9.5 registers 121 names; its main branch 124


@cache
def conversations() -> dict:
    return json.loads((FIXTURES / "conversations.json").read_text(encoding="utf-8"))


def tokenizer(name: str):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(str(FIXTURES / "tokenizers" / name))


def label_mask(ids, labels) -> str:
    return "".join("." if lab == -100 else "+" if lab == i else "e"
                   for i, lab in zip(ids.tolist(), labels.tolist(), strict=True))


def encode_case(name: str, case: dict, date: str, toks: dict) -> dict:
    keys = conversations()["variants"][case["variant"]]
    conv = conversations()["conversations"][case["conversation"]]
    template = load_slot_template(name).with_options(
        enable_thinking=keys.get("enable_thinking", True))
    if case["tokenizer"] not in toks:  # one tokenizer per template (fixing changes it)
        toks[case["tokenizer"]] = tok = tokenizer(case["tokenizer"])
        fix_tokenizer(template, tok)
    tok = toks[case["tokenizer"]]
    encoder = SlotEncoder(template, tok, today=date)
    turns = Turns(conv["system"], conv["tools"], [tuple(m) for m in conv["messages"]])
    mask_history = keys.get("mask_history", False)
    try:
        pairs = encoder.encode_pairs([turns], mask_history)[0]
    except (ValueError, KeyError) as exc:
        return {"error": str(exc)}
    ids, labels, _ = build_sample(pairs, SampleOptions(
        100_000, mask_history=mask_history, efficient_eos=template.efficient_eos,
        eos_id=tok.eos_token_id))
    return {"input_ids": ids.tolist(), "mask": label_mask(ids, labels)}


def test_every_llamafactory_name_is_a_template_with_fixtures():
    names = slot_template_names()
    assert len(names) >= 124
    assert {"qwen3", "qwen3_nothink", "llama2", "deepseek3", "glm4", "yi", "empty",
            "hy_dense_7b", "moss_vl"} <= set(names)
    missing = [n for n in names if not (FIXTURES / f"{n}.json").is_file()]
    assert not missing, f"no parity fixture for {missing}"


@pytest.mark.parametrize("name", slot_template_names())
def test_ids_and_labels_equal_llamafactory(name):
    fixture = json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))
    assert fixture["cases"], name
    toks: dict = {}
    for case in fixture["cases"]:
        got = encode_case(name, case, fixture["date"], toks)
        where = f"{name} / {case['tokenizer']} / {case['conversation']} / {case['variant']}"
        if "error" in case:
            assert "error" in got, f"{where}: LLaMA-Factory refused ({case['error']})"
            continue
        assert "error" not in got, f"{where}: {got.get('error')}"
        assert got["input_ids"] == case["input_ids"], where
        assert got["mask"] == case["mask"], where


@pytest.mark.parametrize("key", sorted(json.loads(
    (FIXTURES / "datasets.json").read_text(encoding="utf-8"))))
def test_llamafactory_demo_data_end_to_end(key):
    """LLaMA-Factory's demo files through dataset_info.json, the format converters and the
    template: tunesmith's samples equal LLaMA-Factory's, tool calls and results included."""
    from tunesmith.config.schema import DataConfig
    from tunesmith.data.loading import DataContext, prepare_data
    from tunesmith.data.slot_renderer import make_renderer
    from tunesmith.data.template import load_template_source

    want = json.loads((FIXTURES / "datasets.json").read_text(encoding="utf-8"))[key]
    dataset, name = key.split("/")
    tok = tokenizer("bpe")
    renderer = make_renderer(*load_template_source(name, tok), tok)
    cfg = DataConfig(dataset=[dataset], dataset_dir=str(FIXTURES.parent / "llamafactory_data"),
                     cutoff_len=4096, preprocessing_num_workers=1)
    data = prepare_data(cfg, DataContext(renderer, tok, 42, "sft"))
    got = [{"input_ids": s.input_ids.tolist(), "mask": label_mask(s.input_ids, s.labels)}
           for s in data.train]
    assert got == want
