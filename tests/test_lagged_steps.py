"""Steps without a host sync (train/lagged.py): the fused optimizer skips non-finite steps on
the device, the loop reads each step's values one step late, and the result is the same as
reading them every step."""

from __future__ import annotations

import json

import pytest
import torch

from test_training import LAGGED, _samples, _trainer, poison_call
from tunesmith.train import lagged as lagged_mod


def _weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("optim,expected", [("adamw_torch_fused", True), ("adamw_torch", False),
                                            ("sgd", False), ("adafactor", False)])
def test_lagged_only_with_a_fused_torch_optimizer(tmp_path, tiny_llama_dir, tiny_tokenizer,
                                                  optim, expected):
    trainer, _ = _trainer(tmp_path, tiny_llama_dir, _samples(tiny_tokenizer, 4), max_steps=1,
                          optim=optim)
    assert trainer.lagged is expected


def test_lagged_run_equals_reading_every_step(tmp_path, tiny_llama_dir, tiny_tokenizer):
    samples = _samples(tiny_tokenizer, 8)
    runs = []
    for name, lag in (("sync", False), ("lagged", True)):
        trainer, model = _trainer(tmp_path / name, tiny_llama_dir, samples, max_steps=5,
                                  per_device_train_batch_size=2, max_grad_norm=0.5,
                                  **{**LAGGED, "logging_steps": 2})
        assert trainer.lagged
        trainer.lagged = lag
        result = trainer.run()
        records = [json.loads(x) for x in
                   (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        runs.append((result.state.last_loss, trainer.scheduler.last_epoch, _weights(model),
                     [(r["step"], r["loss"], r["grad_norm"], r["lr"]) for r in records
                      if "loss" in r]))
    (loss_a, sched_a, w_a, log_a), (loss_b, sched_b, w_b, log_b) = runs
    assert loss_b == loss_a and sched_b == sched_a == 5
    assert [r[0] for r in log_b] == [2, 4, 5] and log_b == log_a  # same values, same steps
    for name, value in w_a.items():
        assert torch.equal(w_b[name], value), name


def test_values_are_read_one_step_late(tmp_path, tiny_llama_dir, tiny_tokenizer, monkeypatch):
    trainer, _ = _trainer(tmp_path, tiny_llama_dir, _samples(tiny_tokenizer, 8), max_steps=6,
                          per_device_train_batch_size=1, **{**LAGGED, "logging_steps": 3})
    events: list[tuple[str, int]] = []
    real_step, real_values = lagged_mod.step_on_device, lagged_mod.PendingStep.values

    def step(t, loss):
        pending = real_step(t, loss)
        events.append(("ran", pending.step))
        return pending

    def values(self):
        events.append(("read", self.step))
        return real_values(self)

    monkeypatch.setattr("tunesmith.train.loop.step_on_device", step)
    monkeypatch.setattr(lagged_mod.PendingStep, "values", values)
    trainer.run()
    # step k is read after step k+1 was launched; at a log step (3, 6) at once
    assert events == [("ran", 1), ("ran", 2), ("read", 1), ("ran", 3), ("read", 2),
                      ("read", 3), ("ran", 4), ("ran", 5), ("read", 4), ("ran", 6),
                      ("read", 5), ("read", 6)]


def test_a_skipped_step_moves_the_schedule_back(tmp_path, tiny_llama_dir, tiny_tokenizer):
    trainer, model = _trainer(tmp_path, tiny_llama_dir, _samples(tiny_tokenizer, 8),
                              max_steps=3, per_device_train_batch_size=1,
                              lr_scheduler_type="linear", **LAGGED)
    poison_call(trainer, 1, float("nan"))
    before = _weights(model)
    trainer.run()
    assert trainer.state.nonfinite_total == 1
    assert trainer.scheduler.last_epoch == 2  # 3 steps, one skipped
    # linear decay over 3 steps: after two applied steps the rate is a third of the start
    assert trainer.scheduler.get_last_lr()[0] == pytest.approx(1e-2 / 3)
    assert any(not torch.equal(p, before[n]) for n, p in _weights(model).items())

