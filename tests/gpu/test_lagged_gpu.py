"""Lagged steps on a GPU (train/lagged.py): the values come back through pinned memory and
an event, a non-finite step is skipped on the device, and the weights equal those of a run
that reads every step."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from tunesmith.adapters.setup import prepare_trainable
from tunesmith.config import load_config
from tunesmith.data.encode import EncodedSample
from tunesmith.train.loop import Trainer
from tunesmith.train.metrics import MetricsLog
from tunesmith.train.objective import NextTokenObjective

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _samples(n: int) -> list[EncodedSample]:
    g = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        ids = torch.randint(3, 200, (12 + i,), generator=g, dtype=torch.int32).numpy()
        out.append(EncodedSample(ids, ids.copy()))
    return out


def _run(tmp_path, model_dir, lagged: bool, poison_call: int = 0):
    cfg = load_config(overrides={"model_name_or_path": str(model_dir), "bf16": True,
                                 "output_dir": str(tmp_path), "logging_steps": 100,
                                 "max_steps": 5, "per_device_train_batch_size": 2,
                                 "learning_rate": 1e-2, "max_grad_norm": 1.0,
                                 "lr_scheduler_type": "constant"})  # skips move no rate
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir).cuda()
    model = prepare_trainable(model, cfg.finetuning, [])
    tmp_path.mkdir(parents=True, exist_ok=True)
    trainer = Trainer(model, NextTokenObjective("chunked", 16), _samples(10), [], cfg.training,
                      pad_id=0, device=torch.device("cuda"), output_dir=tmp_path,
                      metrics=MetricsLog(tmp_path / "metrics.jsonl"), optim=cfg.optim,
                      run=cfg.run)
    assert trainer.lagged  # adamw_torch is fused on CUDA
    trainer.lagged = lagged
    if poison_call:
        real, calls = trainer.objective.loss_sum, {"n": 0}

        def poisoned(m, b):
            calls["n"] += 1
            return real(m, b) * (float("nan") if calls["n"] == poison_call else 1.0)

        trainer.objective.loss_sum = poisoned
    result = trainer.run()
    weights = {n: p.detach().float().cpu() for n, p in model.named_parameters()
               if p.requires_grad}
    return result, trainer, weights


@pytest.mark.parametrize("poison_call", [0, 2])
def test_lagged_equals_synchronous_on_gpu(tmp_path, tiny_llama_dir, poison_call):
    sync, _, w_sync = _run(tmp_path / "sync", tiny_llama_dir, False, poison_call)
    lag, trainer, w_lag = _run(tmp_path / "lag", tiny_llama_dir, True, poison_call)
    assert lag.state.nonfinite_total == sync.state.nonfinite_total == (1 if poison_call else 0)
    assert lag.state.last_loss == sync.state.last_loss
    assert trainer.scheduler.last_epoch == 5 - (1 if poison_call else 0)
    for name, w in w_sync.items():
        assert torch.equal(w_lag[name], w), name
