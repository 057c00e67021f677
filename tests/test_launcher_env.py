"""Launchers: deepspeed's --local_rank and accelerate's FSDP settings (LLaMA-Factory's
examples/accelerate/fsdp_config.yaml) become tunesmith's keys, or a clear error."""

from __future__ import annotations

import pytest

from tunesmith.config import load_config
from tunesmith.config.loader import parse_cli_args
from tunesmith.errors import ConfigError
from tunesmith.train.launcher_env import apply_launcher_env


def test_deepspeed_local_rank_argument_is_accepted_and_checked(monkeypatch):
    _, raw = parse_cli_args(["cfg.yaml", "--local_rank=1"])
    monkeypatch.setenv("LOCAL_RANK", "1")
    cfg = load_config(overrides=raw)
    apply_launcher_env(cfg)  # agrees with the launcher
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match="differs from LOCAL_RANK=0"):
        apply_launcher_env(cfg)


@pytest.mark.parametrize("strategy,offload,expected", [
    ("FULL_SHARD", "false", ["full_shard"]), ("1", "true", ["full_shard", "offload"]),
    ("SHARD_GRAD_OP", "false", ["shard_grad_op"]), ("4", "false", ["hybrid_shard"])])
def test_accelerate_fsdp_config_maps_onto_fsdp(monkeypatch, strategy, offload, expected):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", strategy)
    monkeypatch.setenv("FSDP_OFFLOAD_PARAMS", offload)
    cfg = load_config()
    apply_launcher_env(cfg)
    assert cfg.training.fsdp == expected


def test_accelerate_and_yaml_disagreeing_is_an_error(monkeypatch):
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "SHARD_GRAD_OP")
    with pytest.raises(ConfigError, match="differs from the accelerate config"):
        apply_launcher_env(load_config(overrides={"fsdp": "full_shard,auto_wrap"}))
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "NO_SHARD")
    with pytest.raises(ConfigError, match="not run by tunesmith"):
        apply_launcher_env(load_config())


def test_no_accelerate_env_changes_nothing(monkeypatch):
    monkeypatch.delenv("ACCELERATE_USE_FSDP", raising=False)
    cfg = load_config()
    apply_launcher_env(cfg)
    assert cfg.training.fsdp == []
