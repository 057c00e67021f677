"""Model references: a .gguf file is dequantised once into a cached safetensors folder;
unknown references are explained; report_to and validation are honoured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tunesmith.config import load_config
from tunesmith.errors import ModelError
from tunesmith.models.provision import COMPLETE_MARKER, resolve_model_path
from tunesmith.recipes.export import run_export
from tunesmith.recipes.sft import run_sft


def test_gguf_file_resolves_to_cached_safetensors(tmp_path, tiny_llama_dir, monkeypatch):
    export_dir = tmp_path / "gguf"
    run_export(load_config(overrides={"model_name_or_path": str(tiny_llama_dir),
                                      "export_dir": str(export_dir), "export_format": "gguf",
                                      "gguf_type": "f16"}))
    [gguf] = list(export_dir.glob("*.gguf"))
    monkeypatch.setenv("TUNESMITH_CACHE", str(tmp_path / "cache"))
    folder = resolve_model_path(str(gguf))
    assert Path(folder).parent == tmp_path / "cache" / "models"
    assert (Path(folder) / COMPLETE_MARKER).is_file()
    assert resolve_model_path(str(gguf)) == folder  # converted once, then reused
    ids = torch.randint(3, 300, (1, 10))
    with torch.no_grad():
        ours = AutoModelForCausalLM.from_pretrained(folder)(ids).logits
        ref = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)(ids).logits
    assert float((ours - ref).norm() / ref.norm()) < 1e-2  # f16 round trip


def test_missing_gguf_and_bad_folder(tmp_path):
    with pytest.raises(ModelError, match="does not exist"):
        resolve_model_path(str(tmp_path / "nope.gguf"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="has no config.json"):
        resolve_model_path(str(tmp_path / "empty"))
    assert resolve_model_path("org/model") == "org/model"  # a hub id passes through


def test_validation_split_is_evaluated(tmp_path, tiny_llama_dir, alpaca_file):
    out = tmp_path / "run"
    summary = run_sft(load_config(overrides={
        "model_name_or_path": str(tiny_llama_dir), "dataset": str(alpaca_file),
        "output_dir": str(out), "max_steps": 4, "val_size": 0.25, "eval_steps": 2,
        "per_device_train_batch_size": 2, "save_steps": 0}))
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in records if "eval_loss" in r]
    assert [r["step"] for r in evals] == [2, 4]  # every eval_steps; the end adds none at 4
    assert summary["eval_loss"] == pytest.approx(evals[-1]["eval_loss"])
    assert summary["data"]["samples"] == 24  # encoded; 6 of them are held out for eval


