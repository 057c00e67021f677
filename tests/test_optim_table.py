"""train/optim: the `optim` table, LoRA+ groups, Muon, the optional optimizer families and
the schedule options, each against a reference (torch, transformers, or the formula)."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from tunesmith.config.optim_keys import OptimConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.errors import ConfigError
from tunesmith.train.optim import build_optimizer, build_scheduler, lr_factor
from tunesmith.train.optim.composite import CompositeOptimizer
from tunesmith.train.optim.table import OPTIMIZERS


def _model(seed: int = 0) -> torch.nn.Module:
    from tiny import build_model

    return build_model(seed=seed)


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    ids = torch.arange(12)[None] % 50
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad()


@pytest.mark.parametrize("name", [n for n in OPTIMIZERS if not n.startswith("paged")])
def test_every_optim_name_builds_and_moves_the_weights(name):
    model = _model()
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    opt = build_optimizer(model, TrainingConfig(learning_rate=1e-2), OptimConfig(optim=name))
    _step(model, opt)
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)


def test_optim_names_pick_the_named_class():
    model = _model()
    cfg = TrainingConfig()
    assert type(build_optimizer(model, cfg, OptimConfig(optim="sgd"))) is torch.optim.SGD
    fused = build_optimizer(model, cfg, OptimConfig(optim="adamw_torch_fused"))
    assert fused.defaults["fused"] is True
    assert type(build_optimizer(model, cfg, OptimConfig(optim="adamw_8bit"))).__name__ == \
        "AdamW8bit"


def test_loraplus_gives_b_matrices_the_ratio():
    from tunesmith.adapters.setup import apply_lora
    from tunesmith.config.schema import FinetuningConfig

    model = apply_lora(_model(), FinetuningConfig(lora_rank=4))
    opt = build_optimizer(model, TrainingConfig(learning_rate=1e-3),
                          OptimConfig(loraplus_lr_ratio=16.0))
    lr_of = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    for name, p in model.named_parameters():
        if "lora_A" in name:
            assert lr_of[id(p)] == pytest.approx(1e-3)
        elif "lora_B" in name:
            assert lr_of[id(p)] == pytest.approx(16e-3)
    with pytest.raises(ConfigError, match="needs finetuning_type lora"):
        build_optimizer(_model(), TrainingConfig(), OptimConfig(loraplus_lr_ratio=16.0))


def test_muon_takes_decoder_matrices_and_adamw_the_rest():
    model = _model()
    opt = build_optimizer(model, TrainingConfig(learning_rate=1e-2), OptimConfig(use_muon=True))
    assert isinstance(opt, CompositeOptimizer)
    muon, adamw = opt.parts
    assert type(muon) is torch.optim.Muon and type(adamw) is torch.optim.AdamW
    in_muon = {id(p) for g in muon.param_groups for p in g["params"]}
    assert id(model.model.layers[0].self_attn.q_proj.weight) in in_muon
    assert id(model.model.embed_tokens.weight) not in in_muon
    assert id(model.lm_head.weight) not in in_muon
    # the scheduler reaches both parts; state round-trips
    sched = build_scheduler(opt, TrainingConfig(lr_scheduler_type="linear"), 4)
    _step(model, opt)
    sched.step()
    assert muon.param_groups[0]["lr"] == adamw.param_groups[0]["lr"] < 1e-2
    state = opt.state_dict()
    fresh = build_optimizer(model, TrainingConfig(), OptimConfig(use_muon=True))
    fresh.load_state_dict(state)
    assert fresh.parts[0].state_dict()["state"].keys() == muon.state_dict()["state"].keys()


@pytest.mark.parametrize("key,extra", [("use_galore", {}), ("use_apollo", {}),
                                       ("use_adam_mini", {}), ("use_badam", {})])
def test_optional_families_build_and_step(key, extra):
    model = _model()
    ocfg = OptimConfig(**{key: True}, galore_rank=4, apollo_rank=4, **extra)
    opt = build_optimizer(model, TrainingConfig(learning_rate=1e-2), ocfg)
    before = model.model.layers[0].mlp.up_proj.weight.detach().clone()
    _step(model, opt)
    assert not torch.equal(before, model.model.layers[0].mlp.up_proj.weight)


def test_galore_projects_the_targeted_weights():
    model = _model()
    opt = build_optimizer(model, TrainingConfig(), OptimConfig(
        use_galore=True, galore_target=["q_proj"], galore_rank=4, galore_scale=0.5))
    projected = [g for g in opt.param_groups if "rank" in g]
    assert len(projected) == 1 and projected[0]["scale"] == 0.5
    assert len(projected[0]["params"]) == 2  # q_proj of both layers


def test_a_missing_package_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "galore_torch", None)
    with pytest.raises(ConfigError, match=r"use_galore: needs the galore_torch package.*"
                                          r"tunesmith\[galore\]"):
        build_optimizer(_model(), TrainingConfig(), OptimConfig(use_galore=True))


def test_two_families_are_refused():
    with pytest.raises(ConfigError, match="choose one"):
        build_optimizer(_model(), TrainingConfig(), OptimConfig(use_muon=True,
                                                                 use_adam_mini=True))


@pytest.mark.parametrize("cycles", [0.5, 1.0])
def test_cosine_schedule_equals_transformers(cycles):
    from transformers import get_cosine_schedule_with_warmup

    p = torch.nn.Parameter(torch.zeros(1))
    ref = get_cosine_schedule_with_warmup(torch.optim.SGD([p], lr=1.0), 0, 20,
                                          num_cycles=cycles)
    for step in range(20):
        assert lr_factor(step, "cosine", 0, 20, num_cycles=cycles) == pytest.approx(
            ref.lr_lambdas[0](step), abs=1e-9)


def test_min_lr_rate_floors_the_decay():
    assert lr_factor(10, "cosine", 0, 10, min_lr_rate=0.1) == pytest.approx(0.1)
    assert lr_factor(5, "linear", 0, 10, min_lr_rate=0.2) == pytest.approx(0.2 + 0.8 * 0.5)
    mid = lr_factor(5, "cosine", 0, 10, min_lr_rate=0.1)
    assert mid == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    with pytest.raises(ConfigError, match="not understood"):
        build_scheduler(torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0),
                        TrainingConfig(), 10, {"warmup_power": 2})


def test_optim_args_reach_the_optimizer():
    opt = build_optimizer(_model(), TrainingConfig(), OptimConfig(
        optim="sgd", optim_args="momentum=0.9, nesterov=true"))
    assert opt.param_groups[0]["momentum"] == 0.9 and opt.param_groups[0]["nesterov"] is True
    with pytest.raises(ConfigError, match="rejected by sgd"):
        build_optimizer(_model(), TrainingConfig(), OptimConfig(optim="sgd",
                                                                optim_args="betas=1"))
    with pytest.raises(ConfigError, match="is not key=value"):
        build_optimizer(_model(), TrainingConfig(), OptimConfig(optim_args="momentum"))
