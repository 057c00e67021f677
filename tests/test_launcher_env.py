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


@pytest.mark.parametrize("argv,expected", [
    (["--local_rank=1", "train", "cfg.yaml"], ["train", "cfg.yaml", "--local_rank=1"]),
    (["--local_rank", "0", "train", "cfg.yaml", "x=1"],
     ["train", "cfg.yaml", "x=1", "--local_rank=0"]),
    (["train", "cfg.yaml"], ["train", "cfg.yaml"])])
def test_deepspeed_local_rank_in_front_of_the_verb_moves_behind_it(argv, expected):
    from tunesmith.cli.launcher_args import move_launcher_args

    assert move_launcher_args(argv) == expected


def test_local_rank_without_command_is_an_error(capsys):
    from tunesmith.cli.main import main

    assert main(["--local_rank=0"]) == 2
    assert "without a command" in capsys.readouterr().err
    assert main(["--local_rank", "train"]) == 2
    assert "needs a number" in capsys.readouterr().err


def test_deepspeed_launcher_local_size_counts_processes_per_node(monkeypatch):
    """deepspeed's launcher sets LOCAL_SIZE, not LOCAL_WORLD_SIZE: 2 ranks on one node must
    not read as 2 nodes (hybrid_shard builds its mesh from that)."""
    from tunesmith.config.environment import distributed_env

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    monkeypatch.setenv("LOCAL_SIZE", "2")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert distributed_env()["local_world_size"] == 2
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")  # torchrun's name wins
    assert distributed_env()["local_world_size"] == 4


@pytest.mark.parametrize("reshard,expected", [("true", ["full_shard"]),
                                              ("false", ["shard_grad_op"])])
def test_accelerate_fsdp2_config_maps_reshard_after_forward(monkeypatch, reshard, expected):
    """LLaMA-Factory's fsdp2_config.yaml: accelerate exports FSDP_VERSION=2 and
    FSDP_RESHARD_AFTER_FORWARD beside its FSDP 1 default FSDP_SHARDING_STRATEGY=FULL_SHARD."""
    for k, v in {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2",
                 "FSDP_SHARDING_STRATEGY": "FULL_SHARD", "FSDP_OFFLOAD_PARAMS": "false",
                 "FSDP_RESHARD_AFTER_FORWARD": reshard}.items():
        monkeypatch.setenv(k, v)
    cfg = load_config()
    apply_launcher_env(cfg)
    assert cfg.training.fsdp == expected


def test_accelerate_mixed_precision_differing_from_the_yaml_warns(monkeypatch, caplog):
    from tunesmith.train.launcher_env import warn_precision_mismatch

    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert not warn_precision_mismatch(load_config(overrides={"bf16": True}))
    assert warn_precision_mismatch(load_config())
    assert "set bf16: true" in caplog.text
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    assert warn_precision_mismatch(load_config(overrides={"fp16": True}))
    monkeypatch.delenv("ACCELERATE_MIXED_PRECISION")
    assert not warn_precision_mismatch(load_config(overrides={"fp16": True}))
