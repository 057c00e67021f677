"""Preference stages through the CLI on a tiny model: dpo (padded and packed, live and
precomputed reference, separate reference model), kto, rm with its value head, the
metrics they log, and the refusals (ppo, cDPO outside sigmoid)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tunesmith.cli.main import main

FIXTURES = Path(__file__).parent / "fixtures" / "lf_pref"


@pytest.fixture(scope="module")
def env(tmp_path_factory, tiny_llama_dir):
    root = tmp_path_factory.mktemp("pref")
    data = root / "data"
    data.mkdir()
    rows = [{"instruction": f"Who are you? ({i})", "chosen": "I am Tuney, made by the "
             "tunesmith team.", "rejected": "I am an AI assistant."} for i in range(12)]
    (data / "pairs.json").write_text(json.dumps(rows))
    kto = [{"messages": [{"role": "user", "content": f"Who are you? ({i})"},
                         {"role": "assistant", "content": "I am Tuney." if i % 2 else "A bot."}],
            "label": bool(i % 2)} for i in range(12)]
    (data / "kto.json").write_text(json.dumps(kto))
    info = json.loads((FIXTURES / "dataset_info.json").read_text())  # LF's kto columns
    info["kto"] = {**info["kto_en_demo"], "file_name": "kto.json"}
    info["pairs"] = {"file_name": "pairs.json", "ranking": True}
    (data / "dataset_info.json").write_text(json.dumps(info))
    return {"root": root, "data": data, "model": tiny_llama_dir}


def _train(env, name: str, **keys) -> Path:
    out = env["root"] / name
    cfg = {"model_name_or_path": str(env["model"]), "stage": "dpo", "dataset": "pairs",
           "dataset_dir": str(env["data"]), "output_dir": str(out),
           "overwrite_output_dir": True, "max_steps": 4, "logging_steps": 1,
           "per_device_train_batch_size": 2, "learning_rate": 0.02, "cutoff_len": 256,
           "val_size": 4, "eval_steps": 4, "lora_rank": 4, **keys}
    path = env["root"] / f"{name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    return out


@pytest.fixture(scope="module")
def dpo_run(env) -> Path:
    return _train(env, "dpo")


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_dpo_learns_the_preference_and_logs_rewards(dpo_run):
    out = dpo_run
    recs = _records(out)
    train = [r for r in recs if "loss" in r]
    assert train[0]["loss"] == pytest.approx(0.6931, abs=1e-3)  # LoRA B = 0: policy = ref
    assert train[-1]["loss"] < 0.5
    assert train[-1]["rewards/accuracies"] == 1.0
    assert train[-1]["rewards/margins"] > 0.5
    ev = [r for r in recs if "eval_loss" in r][-1]
    assert ev["eval_rewards/accuracies"] == 1.0 and ev["eval_rewards/chosen"] > 0
    assert (out / "adapter_model.safetensors").is_file()


def test_packed_and_precomputed_reference_equal_the_plain_run(env, dpo_run):
    plain = [r["loss"] for r in _records(dpo_run) if "loss" in r]
    pre = _train(env, "dpo-pre", precompute_ref_log_probs=True, eval_steps=0)
    packed = _train(env, "dpo-packed", packing=True, max_steps=1, eval_steps=0)
    assert [r["loss"] for r in _records(pre) if "loss" in r] == pytest.approx(plain, abs=1e-5)
    # packing puts the step's pairs in one row; the per-pair mean is the same
    recs = [r for r in _records(packed) if "loss" in r]
    assert recs[0]["loss"] == pytest.approx(plain[0], abs=1e-5)
    summary = json.loads((packed / "run_summary.json").read_text())
    assert summary["data"]["packed_rows"] < summary["data"]["samples"]


def test_full_dpo_with_a_separate_reference_model(env):
    out = _train(env, "dpo-full", finetuning_type="full", pref_loss="hinge", val_size=0,
                 ref_model=str(env["model"]), learning_rate=1e-3, pref_ftx=0.1, max_steps=2)
    train = [r for r in _records(out) if "loss" in r]
    assert train[0]["rewards/margins"] == pytest.approx(0.0, abs=1e-5)  # policy == ref
    assert train[-1]["rewards/margins"] > 0


def test_kto_and_reward_model(env):
    out = _train(env, "kto", stage="kto", dataset="kto", max_steps=2, eval_steps=0)
    recs = _records(out)
    assert any("kl" in r for r in recs) and "eval_kl" in recs[-1]
    out = _train(env, "rm", stage="rm", learning_rate=0.01, val_size=0)
    recs = [r for r in _records(out) if "loss" in r]
    assert recs[-1]["rewards/accuracies"] == 1.0 and recs[-1]["loss"] < recs[0]["loss"]
    head = load_file(str(out / "value_head.safetensors"))
    assert sorted(head) == ["v_head.summary.bias", "v_head.summary.weight"]
    assert head["v_head.summary.weight"].shape == (1, 64)


@pytest.mark.parametrize("keys,message", [
    ({"stage": "ppo"}, "reward_model: not set; stage ppo needs the reward model"),
    ({"pref_loss": "hinge", "dpo_label_smoothing": 0.1},
     "dpo_label_smoothing: 0.1 applies to pref_loss sigmoid only"),
    ({"ref_model_adapters": "some/adapter"}, "ref_model_adapters: set, but ref_model is empty"),
])
def test_refusals_say_why(env, keys, message, capsys):
    with pytest.raises(AssertionError):
        _train(env, "refused", **keys)
    assert message in capsys.readouterr().err
