"""LLaMA-Factory's CPU-capable example YAMLs run on SmolLM2-135M-Instruct with LLaMA-Factory's
own demo data (tests/fixtures/llamafactory_data), through `tunesmith train|export`
(tunesmith.cli.main, one process for all runs to save start-up time).

Each YAML is changed only as tools/lf_examples_smollm2.py documents: the model, the data
folder, output paths under a work folder (so one example's output feeds the next, as in
LLaMA-Factory), a step cap (max_steps 1 of one micro-batch: gradient_accumulation_steps 1,
cutoff_len 128; the predict YAML 16 new tokens),
template llama3 -> the tokenizer's own (SmolLM2 lacks llama3's special tokens) and LLaMA
Pro's freeze_trainable_layers 8 -> 6 (a divisor of SmolLM2's 30 layers). Every
other key - batch size, accumulation, optimizer, LoRA settings, workers - is the example's.
The full table of all 52 YAMLs is docs/lf_examples_smollm2.md (python
tools/lf_examples_smollm2.py).
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parents[1] / "tools"))
from lf_examples_smollm2 import DATA_DIR, run_keys  # noqa: E402

from tunesmith.cli.main import main  # noqa: E402

# in order: an example's output is read by a later one (merge, predict, second preprocess)
TRAINED = {  # example -> what it must leave in its output_dir
    "train_lora/qwen3_lora_sft.yaml": "adapter_model.safetensors",
    "extras/loraplus/llama3_lora_sft.yaml": "adapter_model.safetensors",
    "extras/pissa/llama3_lora_sft.yaml": "pissa_converted/adapter_model.safetensors",
    "train_lora/qwen3_lora_pretrain.yaml": "adapter_model.safetensors",
    "train_lora/qwen3_preprocess.yaml": "adapter_model.safetensors",
    "train_full/qwen3_full_sft.yaml": "model.safetensors",  # with DeepSpeed ZeRO-3
    "extras/dft/qwen2_full_sft.yaml": "model.safetensors",
    "extras/muon/qwen2_full_sft.yaml": "model.safetensors",
    "extras/galore/llama3_full_sft.yaml": "model.safetensors",
    "extras/llama_pro/llama3_freeze_sft.yaml": "model.safetensors",
}
MERGE, PREDICT = "merge_lora/qwen3_lora_sft.yaml", "extras/nlg_eval/llama3_lora_predict.yaml"


def _run(verb: str, keys: dict, work: Path, name: str) -> dict:
    path = work / "yaml" / f"{name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(keys), encoding="utf-8")
    start = time.perf_counter()
    code = main([verb, str(path)])
    out = Path(keys.get("export_dir") or keys["output_dir"])
    record = {"code": code, "seconds": time.perf_counter() - start, "keys": keys,
              "files": sorted(str(p.relative_to(out)) for p in out.rglob("*")) if out.is_dir()
              else []}
    for name_, reader in (("summary", json.loads), ("metrics", _jsonl)):
        file = out / ("run_summary.json" if name_ == "summary" else "metrics.jsonl")
        record[name_] = reader(file.read_text()) if file.is_file() else None
    return record


def _jsonl(text: str) -> list[dict]:
    return [json.loads(x) for x in text.splitlines() if x.strip()]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    work = tmp_path_factory.mktemp("lf-smollm2")
    done: dict[str, dict] = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TUNESMITH_CACHE", raising=False)  # the real, shared model cache
        mp.delenv("LOCAL_RANK", raising=False)  # the DeepSpeed run sets it; removed after
        for example in TRAINED:
            done[example] = _run("train", run_keys(example, work, 1), work, example)
            if example == "train_lora/qwen3_preprocess.yaml":  # again: the saved tokens
                keys = {**run_keys(example, work, 1), "dataset_dir": str(work / "no-data")}
                done["preprocess again"] = _run("train", keys, work, "preprocess-again")
        done[MERGE] = _run("export", run_keys(MERGE, work, 1), work, MERGE)
        done[PREDICT] = _run("train", run_keys(PREDICT, work, 1), work, PREDICT)
    print("\n" + "\n".join(f"{k}: {v['seconds']:.1f}s" for k, v in done.items()))
    return done


@pytest.mark.slow
@pytest.mark.parametrize("example", list(TRAINED))
def test_example_trains_a_step_and_writes_its_output(runs, example):
    run = runs[example]
    assert run["code"] == 0
    assert TRAINED[example] in run["files"], run["files"]
    assert run["summary"]["steps"] == 1 and math.isfinite(run["summary"]["final_loss"])
    logged = [r for r in run["metrics"] if "loss" in r]
    assert logged and logged[-1]["step"] == 1 and math.isfinite(logged[-1]["loss"])
    assert run["summary"]["data"]["trained_tokens"] > 0


@pytest.mark.slow
def test_pretrain_reads_the_c4_demo_text(runs):
    run = runs["train_lora/qwen3_lora_pretrain.yaml"]
    lines = (DATA_DIR / "c4_demo.jsonl").read_text().splitlines()
    assert run["keys"]["dataset"] == "c4_demo" and run["keys"]["stage"] == "pt"
    assert run["summary"]["data"]["rows"] == len(lines) == 8


@pytest.mark.slow
def test_preprocess_saves_tokens_a_second_run_loads(runs):
    first, again = runs["train_lora/qwen3_preprocess.yaml"], runs["preprocess again"]
    assert (Path(first["keys"]["tokenized_path"]) / "manifest.json").is_file()
    assert again["code"] == 0  # its dataset_dir does not exist: nothing was re-read
    assert again["summary"]["data"]["cache_hits"] == 1
    assert again["summary"]["data"]["rows"] == first["summary"]["data"]["rows"]


@pytest.mark.slow
def test_merged_model_answers_as_base_plus_adapter(runs):
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tunesmith.models.provision import resolve_model_path

    merge = runs[MERGE]
    assert merge["code"] == 0 and "model.safetensors" in merge["files"]
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("TUNESMITH_CACHE", raising=False)
        base_path = resolve_model_path("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(merge["keys"]["export_dir"])
    ids = tok("Who are you? Tell me in a sentence.", return_tensors="pt")["input_ids"]
    merged = AutoModelForCausalLM.from_pretrained(merge["keys"]["export_dir"],
                                                  dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    with torch.no_grad():
        plain = base(ids).logits
        reference = PeftModel.from_pretrained(base, merge["keys"]["adapter_name_or_path"])
        got, want = merged(ids).logits, reference(ids).logits
    torch.testing.assert_close(got, want, atol=2e-4, rtol=1e-4)
    assert (plain - want).abs().max() > 1e-3  # the trained adapter changes the answer


@pytest.mark.slow
def test_predict_writes_one_generation_per_sample(runs):
    run = runs[PREDICT]
    assert run["code"] == 0
    out = Path(run["keys"]["output_dir"])
    rows = _jsonl((out / "generated_predictions.jsonl").read_text())
    samples = sum(len(json.loads((DATA_DIR / f"{n}.json").read_text()))
                  for n in ("identity", "alpaca_en_demo"))
    assert len(rows) == samples == 16
    assert all(r["predict"].strip() for r in rows)


def test_walk_lists_every_example_with_a_status(tmp_path):
    """The table tool on the examples it does not run (no model needed): a refusal with
    the loader's reason, the token file, and a GPU-only example with its reason."""
    import subprocess

    only = ["extras/mod/llama3_full_sft.yaml", "extras/multi_tokens/tokens_cfg.yaml",
            "extras/fp8/llama3_fp8_fsdp_sft.yaml"]
    table = tmp_path / "table.md"
    done = subprocess.run([sys.executable, "tools/lf_examples_smollm2.py", "--only",
                           ",".join(only), "--work", str(tmp_path / "w"), "--out", str(table)],
                          cwd=Path(__file__).parents[1], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = {r.split("|")[1].strip(" `"): r for r in table.read_text().splitlines()
            if r.startswith("| `")}
    assert sorted(rows) == sorted(only)
    assert "| refused |" in rows[only[0]] and "mixture_of_depths" in rows[only[0]]
    assert "is not a training config" in rows[only[1]]
    assert "| not run here |" in rows[only[2]] and "needs GPU" in rows[only[2]]


def test_committed_table_covers_all_examples():
    from lf_examples import example_files

    table = (Path(__file__).parents[1] / "docs" / "lf_examples_smollm2.md").read_text()
    listed = {r.split("|")[1].strip(" `") for r in table.splitlines() if r.startswith("| `")}
    assert len(listed) == len(example_files()) == 52
