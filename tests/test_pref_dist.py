"""Preference stages on two gloo processes equal one process: DPO under DDP, FSDP2 and
DeepSpeed ZeRO-3 (the per-pair loss is divided by the pairs of the whole step over all
ranks; rewards/accuracy metrics are summed over ranks), and KTO, whose KL estimate z is the
mean over the mismatched completions of every rank (an all-reduce), so each rank's loss uses
the z of the global batch. Adam's epsilon is 1 and clipping off, so a wrongly scaled
gradient would show (see test_dist_equivalence.py). One torchrun launch runs them all."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from test_dist_equivalence import EXAMPLES, _child_env, _has_deepspeed, _max_diff, _run, _torchrun
from tunesmith.config import load_config
from tunesmith.recipes.stages import run_stage

WORKER = Path(__file__).with_name("dist_worker.py")
ADAPTER = "adapter_model.safetensors"


def _keys(root: Path, model: Path, name: str, bs: int, **kw) -> dict:
    return {"model_name_or_path": str(model), "stage": "dpo", "dataset": "pairs",
            "dataset_dir": str(root / "data"), "output_dir": str(root / name),
            "overwrite_output_dir": True, "max_steps": 3, "logging_steps": 1,
            "per_device_train_batch_size": bs, "learning_rate": 0.05, "adam_epsilon": 1.0,
            "max_grad_norm": 0.0, "lora_rank": 4, "save_steps": 0, **kw}


def _write_data(data: Path) -> None:
    data.mkdir()
    rows = [{"instruction": f"Who are you? ({i})", "chosen": "I am Tuney." * (1 + i % 3),
             "rejected": f"A bot {i}."} for i in range(12)]
    (data / "pairs.json").write_text(json.dumps(rows))
    kto = [{"messages": [{"role": "user", "content": f"Who are you? ({i})"},
                         {"role": "assistant", "content": "I am Tuney." * (1 + i % 3)
                          if i % 2 else f"A bot {i}."}], "label": bool(i % 2)}
           for i in range(12)]
    (data / "kto.json").write_text(json.dumps(kto))
    kto_info = {"file_name": "kto.json", "formatting": "sharegpt",
                "columns": {"messages": "messages", "kto_tag": "label"},
                "tags": {"role_tag": "role", "content_tag": "content", "user_tag": "user",
                         "assistant_tag": "assistant"}}
    (data / "pairs11.json").write_text(json.dumps(rows[:11]))
    (data / "dataset_info.json").write_text(json.dumps(
        {"pairs": {"file_name": "pairs.json", "ranking": True}, "kto": kto_info,
         "pairs11": {"file_name": "pairs11.json", "ranking": True}}))


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_llama_dir):
    root = tmp_path_factory.mktemp("prefdist")
    _write_data(root / "data")
    kto = {"stage": "kto", "dataset": "kto", "learning_rate": 0.5}
    ragged = {"dataset": "pairs11", "max_steps": 0, "num_train_epochs": 1}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TUNESMITH_CACHE", str(root / "cache"))
        run_stage(load_config(overrides=_keys(root, tiny_llama_dir, "one", 2)))
        run_stage(load_config(overrides=_keys(root, tiny_llama_dir, "kto-one", 2, **kto)))
        # 11 pairs in steps of 4 micro-batches: the last step has 3, so rank 1's second
        # micro-batch is a weight-0 filler whose rewards must stay out of the metrics
        run_stage(load_config(overrides=_keys(root, tiny_llama_dir, "acc-one", 1,
                                              **ragged, gradient_accumulation_steps=4)))
    specs = [_keys(root, tiny_llama_dir, "acc-two", 1, **ragged, gradient_accumulation_steps=2),
             _keys(root, tiny_llama_dir, "two", 1),
             _keys(root, tiny_llama_dir, "fsdp", 1, fsdp="full_shard"),
             _keys(root, tiny_llama_dir, "kto-two", 1, **kto)]
    if _has_deepspeed():
        specs.append(_keys(root, tiny_llama_dir, "z3", 1,
                           deepspeed=str(EXAMPLES / "ds_z3_config.json")))
    (root / "specs.json").write_text(json.dumps(specs))
    proc = _run(_torchrun(2, str(WORKER), str(root / "specs.json")), _child_env(root),
                timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def _metrics(out: Path) -> list[dict]:
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on Linux")
@pytest.mark.parametrize("run", ["two", "fsdp", "z3", "acc-two"])
def test_dpo_two_ranks_equal_one_process(runs, run):
    if run == "z3":  # deepspeed is in the dev extra (it installs without its CUDA ops)
        assert _has_deepspeed(), "deepspeed is missing: pip install -e '.[dev]'"
    ref = "acc-one" if run == "acc-two" else "one"
    assert _max_diff(runs / ref / ADAPTER, runs / run / ADAPTER) < 1e-5
    moved = load_file(str(runs / ref / ADAPTER))
    assert max(t.abs().max().item() for k, t in moved.items() if "lora_B" in k) > 1e-4
    one, two = _metrics(runs / ref), _metrics(runs / run)
    assert len(one) == len(two) == 3
    for key in ("loss", "rewards/margins", "rewards/accuracies"):
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-5)


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on Linux")
def test_kto_kl_is_averaged_over_ranks(runs):
    one, two = _metrics(runs / "kto-one"), _metrics(runs / "kto-two")
    assert max(r["kl"] for r in one) > 1e-4  # z is live (not clamped to 0) in these steps
    # fp32 rounding differs with the micro-batch shapes (a few 1e-6); a KL not averaged over
    # ranks is off by a factor
    assert [r["kl"] for r in two] == pytest.approx([r["kl"] for r in one], abs=1e-5)
    assert [r["loss"] for r in two] == pytest.approx([r["loss"] for r in one], abs=1e-5)
    assert _max_diff(runs / "kto-one" / ADAPTER, runs / "kto-two" / ADAPTER) < 1e-5
