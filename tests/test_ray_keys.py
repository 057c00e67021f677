"""use_ray and LLaMA-Factory's Ray keys without starting Ray: the worker layout asked of
Ray Train, the checks made before it starts, and the error when ray is absent. The real
2-worker run is tests/test_launchers.py::test_ray_train_two_cpu_workers_equal_one_process."""

from __future__ import annotations

import sys

import pytest

from tunesmith.config import load_config
from tunesmith.distributed.ray_train import (
    check_ray_launch,
    import_ray,
    ray_requested,
    scaling_of,
)
from tunesmith.errors import ConfigError

CPUS = {"CPU": 8.0}
GPUS = {"CPU": 64.0, "GPU": 4.0}


def test_ray_keys_are_accepted_and_use_ray_env_turns_it_on(monkeypatch):
    cfg = load_config(overrides={"ray_num_workers": 2, "ray_run_name": "r",
                                 "ray_storage_path": "/tmp/x", "placement_strategy": "SPREAD",
                                 "resources_per_worker": {"GPU": 1},
                                 "ray_init_kwargs": {"address": "auto"}})
    assert (cfg.ray.ray_num_workers, cfg.ray.placement_strategy) == (2, "SPREAD")
    monkeypatch.delenv("USE_RAY", raising=False)
    assert not ray_requested(cfg)
    assert ray_requested(load_config(overrides={"use_ray": True}))
    monkeypatch.setenv("USE_RAY", "1")  # LLaMA-Factory: USE_RAY=1 llamafactory-cli train
    assert ray_requested(cfg)


def test_ray_storage_filesystem_is_still_refused_with_the_reason():
    with pytest.raises(ConfigError, match="ray_storage_filesystem.*local or mounted"):
        load_config(overrides={"ray_storage_filesystem": "s3"})


@pytest.mark.parametrize("keys,cluster,expected", [
    ({}, CPUS, (False, {"CPU": 1.0})),  # no GPUs: one CPU per worker
    ({}, GPUS, (True, {"GPU": 1.0})),  # LLaMA-Factory's default on a GPU cluster
    ({"device": "cpu"}, GPUS, (False, {"CPU": 1.0})),
    ({"resources_per_worker": {"CPU": 2, "GPU": 1}}, GPUS, (True, {"CPU": 2.0, "GPU": 1.0})),
])
def test_workers_get_the_resources_asked_for(keys, cluster, expected):
    cfg = load_config(overrides={"ray_num_workers": 4, "placement_strategy": "STRICT_PACK",
                                 **keys})
    s = scaling_of(cfg, cluster)
    assert (s["use_gpu"], s["resources_per_worker"]) == expected
    assert (s["num_workers"], s["placement_strategy"]) == (4, "STRICT_PACK")


def test_more_than_the_cluster_has_is_an_error_not_a_wait():
    with pytest.raises(ConfigError, match="need 8 GPU, but the Ray cluster has 4"):
        scaling_of(load_config(overrides={"ray_num_workers": 8}), GPUS)
    with pytest.raises(ConfigError, match="asks for GPUs but device is cpu"):
        scaling_of(load_config(overrides={"device": "cpu",
                                          "resources_per_worker": {"GPU": 1}}), GPUS)


def test_use_ray_under_another_launcher_is_an_error(monkeypatch):
    cfg = load_config(overrides={"use_ray": True})
    for k in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "NPROC_PER_NODE", "NNODES"):
        monkeypatch.delenv(k, raising=False)
    check_ray_launch(cfg)
    monkeypatch.setenv("NPROC_PER_NODE", "2")
    with pytest.raises(ConfigError, match="ray_num_workers"):
        check_ray_launch(cfg)
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ConfigError, match="Ray starts its own workers"):
        check_ray_launch(cfg)


def test_missing_ray_names_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ConfigError, match=r"pip install 'tunesmith\[ray\]'"):
        import_ray()
    from tunesmith.cli.main import main

    for k in ("LOCAL_RANK", "TORCHELASTIC_RUN_ID", "NPROC_PER_NODE", "NNODES"):
        monkeypatch.delenv(k, raising=False)
    assert main(["train", "use_ray=true", f"output_dir={tmp_path}"]) == 1
    assert "tunesmith[ray]" in capsys.readouterr().err


@pytest.mark.parametrize("keys,cluster,expected", [
    ({}, CPUS, "gloo"), ({}, GPUS, "nccl"), ({"ddp_backend": "gloo"}, GPUS, "gloo"),
    ({"fsdp": "full_shard,offload"}, GPUS, "cpu:gloo,cuda:nccl")])
def test_ray_trainer_gets_the_backend_torchrun_would_use(keys, cluster, expected, tmp_path):
    pytest.importorskip("ray.train", reason="the ray extra is not installed")
    from tunesmith.distributed.ray_train import trainer_kwargs

    cfg = load_config(overrides={"ddp_timeout": 77, "ray_run_name": "r",
                                 "ray_storage_path": str(tmp_path), **keys})
    kw = trainer_kwargs(cfg, cluster, worker=print)
    assert (kw["torch_config"].backend, kw["torch_config"].timeout_s) == (expected, 77)
    assert kw["scaling_config"].use_gpu == (cluster is GPUS)
    assert (kw["run_config"].name, kw["run_config"].storage_path) == ("r", str(tmp_path))


def test_llamafactory_ray_example_runs_on_ray_with_its_worker_count(monkeypatch, tmp_path):
    """LLaMA-Factory's train_lora/qwen3_lora_sft_ray.yaml (ray_num_workers: 4), started
    as LLaMA-Factory starts it (USE_RAY=1): 4 workers, one GPU each on a GPU cluster; on a
    2-CPU machine the shortfall is named instead of Ray waiting for resources."""
    from lf_examples import EXAMPLES, substituted
    from tunesmith.config.loader import build_config

    monkeypatch.setenv("USE_RAY", "1")
    cfg = build_config(substituted(EXAMPLES / "train_lora" / "qwen3_lora_sft_ray.yaml",
                                   "tiny-model", tmp_path))
    assert ray_requested(cfg)
    assert scaling_of(cfg, GPUS)["resources_per_worker"] == {"GPU": 1.0}
    assert scaling_of(cfg, GPUS)["num_workers"] == 4
    with pytest.raises(ConfigError, match="4 workers x CPU 1 need 4 CPU, but the Ray "
                                          "cluster has 2"):
        scaling_of(cfg, {"CPU": 2.0})
