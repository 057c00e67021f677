"""Stage ppo on the GPU (bf16 autocast, bf16 frozen base): the CPU test's lowercase-reward
run through the CLI, on cuda. Cheap: a 2-layer model, 8 steps of 8 prompts."""

from __future__ import annotations

import json
import math

import pytest
import torch
import yaml

from test_ppo_train import _peaked_model, _records, scorer_url  # noqa: F401 (fixture)
from tiny import write_alpaca
from tunesmith.cli.main import main

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_ppo_runs_in_bf16_on_the_gpu(tmp_path, scorer_url):  # noqa: F811
    data = tmp_path / "data"
    data.mkdir()
    write_alpaca(data / "alpaca.json", 16)
    (data / "dataset_info.json").write_text(json.dumps({"alpaca": {"file_name": "alpaca.json"}}))
    keys = {"model_name_or_path": str(_peaked_model(tmp_path / "tiny")), "stage": "ppo",
            "dataset": "alpaca", "dataset_dir": str(data), "output_dir": str(tmp_path / "out"),
            "reward_model": scorer_url, "reward_model_type": "api", "ppo_score_norm": True,
            "max_steps": 8, "per_device_train_batch_size": 8, "ppo_epochs": 2,
            "learning_rate": 0.005, "lr_scheduler_type": "constant", "max_new_tokens": 8,
            "temperature": 1.0, "top_p": 1.0, "top_k": 0, "logging_steps": 1,
            "save_steps": 0, "seed": 42, "bf16": True, "device": "cuda"}
    (tmp_path / "ppo.yaml").write_text(yaml.safe_dump(keys))
    assert main(["train", str(tmp_path / "ppo.yaml")]) == 0
    records = _records(tmp_path / "out")
    assert len(records) == 8
    for r in records:
        for key in ("reward", "kl", "policy_loss", "value_loss", "entropy"):
            assert math.isfinite(r[key]), (key, r)
    rewards = [r["reward"] for r in records]
    assert sum(rewards[-3:]) / 3 > sum(rewards[:2]) / 2, rewards
    assert (tmp_path / "out" / "value_head.safetensors").is_file()
