"""DPO on two gloo processes equals one process: the per-pair loss is divided by the pairs
of the whole step over all ranks, and the rewards/accuracy metrics are summed over ranks.
Adam's epsilon is 1 and clipping off, so a wrongly scaled gradient would show (see
test_dist_equivalence.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

from test_dist_equivalence import _child_env, _max_diff, _run, _torchrun
from tunesmith.config import load_config
from tunesmith.recipes.stages import run_stage

WORKER = Path(__file__).with_name("dist_worker.py")


def _keys(root: Path, model: Path, name: str, bs: int) -> dict:
    return {"model_name_or_path": str(model), "stage": "dpo", "dataset": "pairs",
            "dataset_dir": str(root / "data"), "output_dir": str(root / name),
            "overwrite_output_dir": True, "max_steps": 3, "logging_steps": 1,
            "per_device_train_batch_size": bs, "learning_rate": 0.05, "adam_epsilon": 1.0,
            "max_grad_norm": 0.0, "lora_rank": 4, "save_steps": 0}


@pytest.mark.skipif(sys.platform != "linux", reason="torchrun with gloo on Linux")
def test_dpo_two_ranks_equal_one_process(tmp_path, tiny_llama_dir, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"instruction": f"Who are you? ({i})", "chosen": "I am Tuney." * (1 + i % 3),
             "rejected": f"A bot {i}."} for i in range(12)]
    (data / "pairs.json").write_text(json.dumps(rows))
    (data / "dataset_info.json").write_text(json.dumps(
        {"pairs": {"file_name": "pairs.json", "ranking": True}}))
    run_stage(load_config(overrides=_keys(tmp_path, tiny_llama_dir, "one", 2)))
    (tmp_path / "specs.json").write_text(json.dumps([_keys(tmp_path, tiny_llama_dir, "two", 1)]))
    proc = _run(_torchrun(2, str(WORKER), str(tmp_path / "specs.json")), _child_env(tmp_path),
                timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name = "adapter_model.safetensors"
    assert _max_diff(tmp_path / "one" / name, tmp_path / "two" / name) < 1e-5
    moved = load_file(str(tmp_path / "one" / name))
    assert max(t.abs().max().item() for k, t in moved.items() if "lora_B" in k) > 1e-4
    one, two = ([json.loads(x) for x in (tmp_path / n / "metrics.jsonl").read_text()
                 .splitlines()] for n in ("one", "two"))
    for key in ("loss", "rewards/margins", "rewards/accuracies"):
        assert [r[key] for r in two] == pytest.approx([r[key] for r in one], abs=1e-5)
