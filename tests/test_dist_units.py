"""Fast checks of the distributed pieces that need no second process: sharding, launch
decisions, strategy choice from the config, the rank-0 data hand-off's waiting side."""

from __future__ import annotations

import threading
import time

import pytest

from tunesmith.config import load_config
from tunesmith.config.environment import LaunchEnv, launch_env
from tunesmith.data.batching import epoch_batches
from tunesmith.distributed.context import DistContext, pick_backend
from tunesmith.distributed.handoff import _wait_for, prepare_on_main
from tunesmith.distributed.launch import processes_to_launch, torchrun_command
from tunesmith.distributed.sharding import shard_step, steps_in_plan
from tunesmith.distributed.strategy import fsdp_settings, strategy_name
from tunesmith.errors import ConfigError, TrainingError


@pytest.mark.parametrize("n,bs,world,accum", [(24, 1, 2, 1), (23, 2, 2, 1), (7, 3, 4, 2),
                                              (5, 1, 8, 1), (100, 4, 3, 3)])
def test_shards_are_disjoint_and_cover_every_sample(n, bs, world, accum):
    for epoch in range(2):
        plan = epoch_batches(n, bs, epoch, seed=7)
        steps = [plan[i:i + accum * world] for i in range(0, len(plan), accum * world)]
        assert len(steps) == steps_in_plan(len(plan), accum, world)
        seen = []
        for entries in steps:
            per_rank = [shard_step(entries, r, world) for r in range(world)]
            seen += [i for shards in per_rank for s in shards if s.live for i in s.indices]
            # every rank runs the same number of micro-batches (collectives stay matched)
            assert len({len(shards) for shards in per_rank}) == 1
        assert sorted(seen) == list(range(n))  # complete, and no sample twice


def test_two_ranks_of_micro_batch_1_see_one_rank_of_micro_batch_2():
    one = epoch_batches(10, 2, 0, seed=1)
    halves = epoch_batches(10, 1, 0, seed=1)
    two = [shard_step(halves[i:i + 2], 0, 2)[0].indices + shard_step(halves[i:i + 2], 1, 2)[0]
           .indices for i in range(0, 10, 2)]
    assert two == one


def test_an_empty_slot_becomes_a_weight_zero_filler():
    shards = shard_step([[5, 6], [7]], rank=1, world=2)
    assert [s.indices for s in shards] == [[7]] and shards[0].live
    shards = shard_step([[5, 6]], rank=1, world=2)
    assert not shards[0].live and shards[0].indices == [5, 6]
    with pytest.raises(ValueError):
        shard_step([], rank=0, world=1)


def _env(**kw) -> LaunchEnv:
    base = dict(launched=False, nproc_per_node=None, nnodes=1, node_rank=0, master_addr="",
                master_port=None, force_torchrun=False)
    return LaunchEnv(**{**base, **kw})


def test_launch_decisions():
    assert processes_to_launch(_env(), gpu_count=0) == 0  # CPU: run in this process
    assert processes_to_launch(_env(), gpu_count=1) == 0
    assert processes_to_launch(_env(), gpu_count=8) == 8  # one process per GPU
    assert processes_to_launch(_env(nproc_per_node=2), gpu_count=8) == 2
    assert processes_to_launch(_env(nproc_per_node=2), gpu_count=0) == 2  # CPU, gloo
    assert processes_to_launch(_env(launched=True), gpu_count=8) == 0  # torchrun/accelerate
    assert processes_to_launch(_env(nnodes=2, master_addr="h", master_port=1), 1) == 1
    with pytest.raises(ConfigError, match="NPROC_PER_NODE=4"):
        processes_to_launch(_env(nproc_per_node=4), gpu_count=2)


def test_torchrun_command_carries_the_node_layout():
    cmd = torchrun_command(_env(nnodes=2, node_rank=1, master_addr="10.0.0.1",
                                master_port=29500), 8, ["train", "a.yaml"])
    text = " ".join(cmd)
    assert "--nnodes 2 --node_rank 1 --nproc_per_node 8" in text
    assert "--master_addr 10.0.0.1 --master_port 29500 -m tunesmith train a.yaml" in text
    with pytest.raises(ConfigError, match="MASTER_ADDR"):
        torchrun_command(_env(nnodes=2), 8, ["train"])
    with pytest.raises(ConfigError, match="NODE_RANK=2"):
        torchrun_command(_env(nnodes=2, node_rank=2, master_addr="h", master_port=1), 1, [])


def test_launch_env_reads_llamafactory_variables(monkeypatch):
    for k, v in dict(NNODES="2", NODE_RANK="1", NPROC_PER_NODE="4", MASTER_ADDR="10.1.1.1",
                     MASTER_PORT="29501").items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    env = launch_env()
    assert (env.nnodes, env.node_rank, env.nproc_per_node, env.master_addr, env.master_port) == (
        2, 1, 4, "10.1.1.1", 29501)
    assert not env.launched
    monkeypatch.setenv("NNODES", "two")
    with pytest.raises(ConfigError, match="NNODES='two'"):
        launch_env()


def test_strategy_from_the_yaml_keys():
    two = DistContext(rank=0, world_size=2)
    one = DistContext()
    assert strategy_name(load_config(overrides={}).training, two) == "ddp"
    assert strategy_name(load_config(overrides={}).training, one) == "single"
    t = load_config(overrides={"fsdp": "shard_grad_op offload".replace(" ", ",")}).training
    assert strategy_name(t, two) == "fsdp"
    s = fsdp_settings(t)
    assert not s.reshard_after_forward and s.cpu_offload
    assert fsdp_settings(load_config(overrides={"fsdp": "hybrid_shard"}).training).hybrid
    with pytest.raises(ConfigError, match="full_shrad"):
        fsdp_settings(load_config(overrides={"fsdp": "full_shrad"}).training)
    with pytest.raises(ConfigError, match="choose one"):
        strategy_name(load_config(overrides={"fsdp": "full_shard", "deepspeed": "x.json"}
                                  ).training, two)
    with pytest.raises(ConfigError, match="reshard"):
        fsdp_settings(load_config(overrides={"fsdp": "full_shard",
                                             "fsdp_config": {"reshrad": True}}).training)


def test_ddp_backend_key():
    import torch

    cfg = load_config(overrides={"ddp_backend": "gloo", "ddp_timeout": 60}).training
    assert cfg.ddp_backend == "gloo"
    assert pick_backend("auto", torch.device("cpu")) == "gloo"
    assert pick_backend("auto", torch.device("cuda", 0)) == "nccl"
    assert pick_backend("auto", torch.device("cuda", 0), cpu_offload=True) == "cpu:gloo,cuda:nccl"
    with pytest.raises(ConfigError, match="nccl needs CUDA"):
        pick_backend("nccl", torch.device("cpu"))
    with pytest.raises(ConfigError, match="ddp_backend"):
        load_config(overrides={"ddp_backend": "ncl"})


def test_deepspeed_config_auto_values_come_from_the_yaml(tmp_path):
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    from tunesmith.distributed.deepspeed import load_ds_config

    path = tmp_path / "ds.json"
    path.write_text('{"train_micro_batch_size_per_gpu": "auto", "gradient_clipping": "auto",'
                    ' "zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}')
    t = load_config(overrides={"deepspeed": str(path), "per_device_train_batch_size": 4,
                               "gradient_accumulation_steps": 2, "max_grad_norm": 0.5}).training
    conf = load_ds_config(t, DistContext(world_size=2))
    assert conf["train_batch_size"] == 16 and conf["gradient_clipping"] == 0.5
    assert conf["zero_optimization"]["reduce_bucket_size"] == "auto"  # set from the model
    path.write_text('{"train_micro_batch_size_per_gpu": 8}')
    with pytest.raises(ConfigError, match="train_micro_batch_size_per_gpu=8"):
        load_ds_config(t, DistContext(world_size=2))
    path.write_text('{"optimizer": {"type": "AdamW"}}')
    with pytest.raises(ConfigError, match="remove 'optimizer'"):
        load_ds_config(t, DistContext(world_size=2))


def test_waiting_ranks_see_rank0_finish_or_fail(tmp_path):
    done, failed = tmp_path / "x.done", tmp_path / "x.failed"
    threading.Timer(0.3, done.touch).start()
    t0 = time.monotonic()
    _wait_for(done, failed, timeout_s=10, rank=1)
    assert time.monotonic() - t0 >= 0.25
    done.unlink()
    failed.write_text("DataError: 3 bad rows")
    with pytest.raises(TrainingError, match="rank 0 failed.*3 bad rows"):
        _wait_for(done, failed, timeout_s=10, rank=1)
    failed.unlink()
    with pytest.raises(TrainingError, match="waited 0 s"):
        _wait_for(done, failed, timeout_s=0.3, rank=1)


def test_single_process_handoff_just_builds(tmp_path):
    assert prepare_on_main(lambda: [1, 2], tmp_path, "d", DistContext(), 5) == [1, 2]
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("threshold,frozen", [(None, False), (0, False), (None, True)])
def test_zero3_gathers_each_decoder_layer_whole(threshold, frozen, tmp_path, monkeypatch):
    """ZeRO-3 hooks each decoder layer, not the Linears and norms inside it (one gather
    and one gradient reduction per layer); a JSON that sets DeepSpeed's own
    stage3_module_granularity_threshold keeps DeepSpeed's grouping. Layers with frozen
    weights are whole too (tests/test_dist_equivalence.py's z3-freeze and
    tests/test_pref_dist.py's LoRA z3 run them on 2 ranks)."""
    pytest.importorskip("deepspeed", reason="the deepspeed extra is not installed")
    import json

    import torch

    from tiny import build_model
    from tunesmith.distributed.deepspeed import DeepSpeedStrategy
    from tunesmith.distributed.strategy import decoder_layers
    from tunesmith.train.objective import NextTokenObjective

    monkeypatch.delenv("LOCAL_RANK", raising=False)
    zero = {"stage": 3, "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"}
    if threshold is not None:
        zero["stage3_module_granularity_threshold"] = threshold
    path = tmp_path / "z3.json"
    path.write_text(json.dumps({"zero_optimization": zero}))
    t = load_config(overrides={"deepspeed": str(path), "per_device_train_batch_size": 1,
                               "finetuning_type": "full"}).training
    model = build_model()
    if frozen:  # as LoRA leaves it: layer 0's input (the embeddings) needs no gradient
        model.model.layers[0].mlp.down_proj.weight.requires_grad_(False)
        model.model.embed_tokens.weight.requires_grad_(False)
    n = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them
    s = DeepSpeedStrategy(DistContext(), t)
    s.wrap(model, NextTokenObjective())
    s.attach_optimizer(torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                         lr=1e-3))
    layers = decoder_layers(model)
    # "auto" buckets: DeepSpeed's 5e8 elements, at most the model (this one is tiny)
    sizes = s.conf["zero_optimization"]
    assert sizes["reduce_bucket_size"] == sizes["stage3_prefetch_bucket_size"] == n < 5e8
    hooked_inside = [hasattr(layer.mlp.down_proj, "ds_id") for layer in layers]
    if threshold is None:
        assert s.fetch_units == len(layers) == 2
        assert all(getattr(layer, "_z3_leaf", False) for layer in layers)
        assert not any(hooked_inside)  # the layer is DeepSpeed's unit: nothing below it
    else:
        assert s.fetch_units == 0 and all(hooked_inside)
    import numpy as np

    from tunesmith.data.batching import collate
    from tunesmith.data.encode import EncodedSample

    ids = np.array([3, 4, 5, 6, 7, 8], dtype=np.int32)
    seen = []
    layers[0].register_forward_hook(lambda m, args, out: seen.append(args[0].requires_grad))
    loss = s.loss_module(collate([EncodedSample(ids, ids.copy())], pad_id=0))
    # a whole layer that trains gets an input that requires grad, so DeepSpeed's gradient
    # hook on the layer fires after the layer's backward, not before it
    assert seen == [True] if threshold is None else [not frozen]
    s.backward(loss)  # the layer-wise hooks gather and reduce without error
    assert torch.isfinite(loss)


def test_one_process_deepspeed_group_binds_a_numbered_gpu(monkeypatch):
    """`tunesmith train` with a deepspeed key on one GPU and no launcher forms a 1-rank NCCL
    group; NCCL refuses a device without an index ("Please use a device_id with index",
    torch 2.11 on an H200), which the context's plain "cuda" device is."""
    import torch
    import torch.distributed as dist

    from tunesmith.distributed import deepspeed as ds_mod

    seen = {}
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, **kw: seen.update(
        backend=backend, **kw))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv("LOCAL_RANK", "0")
    ds_mod.join_single_rank_group(DistContext(device=torch.device("cuda")))
    assert seen["backend"] == "nccl" and seen["device_id"] == torch.device("cuda", 0)
    ds_mod.join_single_rank_group(DistContext(device=torch.device("cuda", 1)))
    assert seen["device_id"] == torch.device("cuda", 1)
    ds_mod.join_single_rank_group(DistContext())
    assert seen["backend"] == "gloo" and seen["device_id"] is None
