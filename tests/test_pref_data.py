"""Preference data: LLaMA-Factory's ranking and KTO datasets, pairs kept together, bad
pairs reported with file:line, stages refusing the wrong kind of data, and packed pairs
giving the same log-probabilities as padded ones."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from datahelp import prepare, write_jsonl
from tiny import build_model
from tunesmith.data.batching import collate
from tunesmith.data.packing import PackedSamples
from tunesmith.errors import DataError
from tunesmith.train.objectives.completion import completion_logps

FIXTURES = Path(__file__).parent / "fixtures" / "lf_pref"


def _lf_dir(tmp_path: Path) -> Path:
    return Path(shutil.copytree(FIXTURES, tmp_path / "data"))


def test_lf_demo_pairs_and_kto_labels(tiny_tokenizer, tmp_path):
    folder = str(_lf_dir(tmp_path))
    dpo = prepare(tiny_tokenizer, stage="dpo", dataset=["dpo_en_demo"], dataset_dir=folder)
    assert len(dpo.train) == 16 and dpo.report.encode.samples == 16
    raw = json.loads((FIXTURES / "dpo_en_demo.json").read_text())
    item = dpo.train.stores[0][3]
    assert raw[3]["chosen"]["value"][:20] in tiny_tokenizer.decode(item.chosen.input_ids)
    assert raw[3]["rejected"]["value"][:20] in tiny_tokenizer.decode(item.rejected.input_ids)
    kto = prepare(tiny_tokenizer, stage="kto", dataset=["kto_en_demo"], dataset_dir=folder)
    items = [kto.train.stores[0][i] for i in range(16)]
    labels = [r["label"] for r in json.loads((FIXTURES / "kto_en_demo.json").read_text())]
    assert [it.chosen is not None for it in items] == labels
    # the KL completion: own prompt, the next item's answer
    nxt = items[1].chosen or items[1].rejected
    own = items[0].chosen or items[0].rejected
    answer = nxt.input_ids[(nxt.labels != -100).argmax():]
    assert items[0].kl.input_ids[-len(answer):].tolist() == answer.tolist()
    assert items[0].kl.input_ids[:5].tolist() == own.input_ids[:5].tolist()


def test_pairs_of_one_json_line_stay_distinct(tiny_tokenizer, tmp_path):
    rows = [{"instruction": f"Q{i}", "chosen": f"good {i}", "rejected": f"bad {i}"}
            for i in range(4)]
    (tmp_path / "p.json").write_text(json.dumps(rows))  # every row on line 1
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"p": {"file_name": "p.json", "ranking": True}}))
    data = prepare(tiny_tokenizer, stage="rm", dataset=["p"], dataset_dir=str(tmp_path))
    for i in range(4):
        item = data.train.stores[0][i]
        assert tiny_tokenizer.decode(item.chosen.input_ids).count(f"good {i}") == 1
        assert tiny_tokenizer.decode(item.rejected.input_ids).count(f"bad {i}") == 1


def test_bad_pairs_and_labels_are_reported_with_file_and_line(tiny_tokenizer, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"instruction": "a", "chosen": "b", "rejected": "c"},
                                       {"instruction": "a", "chosen": "b"}])
    kto_rows = [{"conversations": [{"from": "human", "value": "hi"}, {"from": "gpt", "value": "yo"}],
                 "label": "yes"}]
    write_jsonl(tmp_path / "k.jsonl", kto_rows)
    (tmp_path / "dataset_info.json").write_text(json.dumps({
        "p": {"file_name": "p.jsonl", "ranking": True},
        "k": {"file_name": "k.jsonl", "formatting": "sharegpt", "columns": {"kto_tag": "label"}}}))
    with pytest.raises(DataError, match=r"p\.jsonl:2: missing column 'rejected'"):
        prepare(tiny_tokenizer, stage="dpo", dataset=["p"], dataset_dir=str(tmp_path))
    with pytest.raises(DataError, match=r"k\.jsonl:1: column 'label' \(kto_tag\) is 'yes'"):
        prepare(tiny_tokenizer, stage="kto", dataset=["k"], dataset_dir=str(tmp_path))


def test_stages_refuse_the_wrong_kind_of_data(tiny_tokenizer, tmp_path):
    folder = str(_lf_dir(tmp_path))
    with pytest.raises(DataError, match="kto_tag labels.*stage sft would train on the "
                                        "undesirable answers"):
        prepare(tiny_tokenizer, stage="sft", dataset=["kto_en_demo"], dataset_dir=folder)
    with pytest.raises(DataError, match="stage kto needs kto_tag labels"):
        prepare(tiny_tokenizer, stage="kto", dataset=["dpo_en_demo"], dataset_dir=folder)
    write_jsonl(tmp_path / "plain.jsonl", [{"instruction": "a", "output": "b"}])
    with pytest.raises(DataError, match="not a preference dataset; stage dpo needs pairs"):
        prepare(tiny_tokenizer, stage="dpo", dataset=[str(tmp_path / "plain.jsonl")])


def test_a_pair_with_a_dropped_answer_is_dropped_whole(tiny_tokenizer, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [
        {"instruction": "a", "chosen": "short", "rejected": "long " * 200},
        {"instruction": "b", "chosen": "fine", "rejected": "also fine"}])
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"p": {"file_name": "p.jsonl", "ranking": True}}))
    data = prepare(tiny_tokenizer, stage="dpo", dataset=["p"], dataset_dir=str(tmp_path),
                   cutoff_len=64, truncation="drop")
    assert len(data.train) == 1
    assert data.report.encode.dropped_too_long == [f"{tmp_path / 'p.jsonl'}:1 (rejected)"]


def test_packed_pairs_give_the_padded_log_probs(tiny_tokenizer, tmp_path):
    write_jsonl(tmp_path / "p.jsonl", [{"instruction": f"Question {i}?" * (i + 1),
                                        "chosen": "yes " * (i + 2), "rejected": f"no {i}"}
                                       for i in range(6)])
    (tmp_path / "dataset_info.json").write_text(json.dumps(
        {"p": {"file_name": "p.jsonl", "ranking": True}}))
    data = prepare(tiny_tokenizer, stage="dpo", dataset=["p"], dataset_dir=str(tmp_path))
    items = [data.train[i] for i in range(6)]
    model = build_model(vocab_size=len(tiny_tokenizer)).eval()
    padded = collate(items, tiny_tokenizer.pad_token_id)
    assert padded.loss_units == 6 and padded.n_seqs == 12
    packed_rows = PackedSamples(items, data.train.lengths[:6], 256)
    assert len(packed_rows) < 6  # several pairs share a row
    packed = collate([packed_rows[i] for i in range(len(packed_rows))],
                     tiny_tokenizer.pad_token_id)
    assert packed.cu_seqlens is not None and packed.loss_units == 6
    with torch.no_grad():
        a, b = completion_logps(model, padded), completion_logps(model, packed)
    # the same completions in another layout: compare per (item, slot)
    order = [j for row in packed_rows.rows for j in row]
    for k, j in enumerate(order):
        torch.testing.assert_close(b[packed.chosen_pos[k]], a[padded.chosen_pos[j]],
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(b[packed.rejected_pos[k]], a[padded.rejected_pos[j]],
                                   atol=1e-4, rtol=1e-4)
