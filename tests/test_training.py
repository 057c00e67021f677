"""Training invariants on tiny models: masking, accumulation, reload, non-finite handling."""

from __future__ import annotations

import math

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tunesmith.adapters.setup import prepare_trainable
from tunesmith.config import load_config
from tunesmith.data.conversation import Conversation, Message
from tunesmith.data.encode import IGNORE_INDEX, EncodeOptions, encode_conversations
from tunesmith.data.template import ChatRenderer
from tunesmith.errors import TrainingError
from tunesmith.recipes.sft import run_sft
from tunesmith.train.loop import Trainer
from tunesmith.train.metrics import MetricsLog
from tunesmith.train.objective import NextTokenObjective


def _conv(*turns: tuple[str, str]) -> Conversation:
    return Conversation([Message(r, c) for r, c in turns], source="test")


def test_loss_mask_covers_exactly_assistant_tokens(tiny_tokenizer):
    tok = tiny_tokenizer
    renderer = ChatRenderer("tokenizer", tok.chat_template, tok)
    conv = _conv(("system", "Be brief."), ("user", "Who are you?"), ("assistant", "I am Tuney."),
                 ("user", "And who made you?"), ("assistant", "The tunesmith team. 🙂"))
    [sample], _, _ = encode_conversations([conv], renderer, tok, EncodeOptions(cutoff_len=512))
    ids = tok.apply_chat_template(conv.dicts(), tokenize=True, return_dict=False)
    assert sample.input_ids.tolist() == list(ids)
    trained = tok.decode([int(i) for i, lab in zip(sample.input_ids, sample.labels, strict=True)
                          if lab != IGNORE_INDEX])
    assert trained == "I am Tuney.<|im_end|>\nThe tunesmith team. 🙂<|im_end|>\n"
    # every other token (system, user turns, headers) is masked
    masked = [i for i, lab in zip(sample.input_ids, sample.labels, strict=True)
              if lab == IGNORE_INDEX]
    assert tok.decode(masked).startswith("<|im_start|>system\nBe brief.<|im_end|>")

    [last_only], _, _ = encode_conversations([conv], renderer, tok,
                                          EncodeOptions(cutoff_len=512, mask_history=True))
    assert tok.decode(last_only.input_ids[last_only.labels != IGNORE_INDEX]) == (
        "The tunesmith team. 🙂<|im_end|>\n")
    [everything], _, _ = encode_conversations([conv], renderer, tok,
                                           EncodeOptions(cutoff_len=512, train_on_prompt=True))
    assert (everything.labels != IGNORE_INDEX).all()


def _trainer(tmp_path, model_dir, samples, **overrides):
    cfg = load_config(overrides={"model_name_or_path": str(model_dir),
                                 "output_dir": str(tmp_path), "logging_steps": 1,
                                 "learning_rate": 1e-2, "max_grad_norm": 0, **overrides})
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    model = prepare_trainable(model, cfg.finetuning, [])
    tmp_path.mkdir(parents=True, exist_ok=True)
    metrics = MetricsLog(tmp_path / "metrics.jsonl")
    trainer = Trainer(model, NextTokenObjective("chunked", 16), samples, [], cfg.training,
                      pad_id=0, device=torch.device("cpu"), output_dir=tmp_path,
                      metrics=metrics, optim=cfg.optim, run=cfg.run)
    return trainer, model


def poison_call(trainer, call: int, value: float) -> None:
    """Multiply the loss of the objective's `call`-th call (1-based) by `value`."""
    real, calls = trainer.objective.loss_sum, {"n": 0}

    def poisoned(m, b):
        calls["n"] += 1
        return real(m, b) * (value if calls["n"] == call else 1.0)

    trainer.objective.loss_sum = poisoned


def _samples(tokenizer, n=8):
    renderer = ChatRenderer("tokenizer", tokenizer.chat_template, tokenizer)
    convs = [_conv(("user", f"what is {i} plus {i}?" + " really" * (i % 4)),
                   ("assistant", f"It is {2 * i}." + " yes" * (i % 3))) for i in range(n)]
    samples, _, _ = encode_conversations(convs, renderer, tokenizer, EncodeOptions(512))
    return samples


def _record_grads(trainer, model) -> list[dict[str, torch.Tensor]]:
    """Grads as the optimizer sees them at every step (Adam would hide their scale)."""
    seen: list[dict[str, torch.Tensor]] = []
    real_step = trainer.optimizer.step

    def step(*args, **kwargs):
        seen.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
        return real_step(*args, **kwargs)

    trainer.optimizer.step = step
    return seen


@pytest.mark.parametrize("finetuning_type", ["lora", "full"])
def test_gradient_accumulation_equals_large_batch(tmp_path, tiny_llama_dir, tiny_tokenizer,
                                                  finetuning_type):
    samples = _samples(tiny_tokenizer, 8)  # unequal lengths: token normalisation matters
    a, model_a = _trainer(tmp_path / "a", tiny_llama_dir, samples, max_steps=2,
                          per_device_train_batch_size=1, gradient_accumulation_steps=4,
                          finetuning_type=finetuning_type)
    b, model_b = _trainer(tmp_path / "b", tiny_llama_dir, samples, max_steps=2,
                          per_device_train_batch_size=4, gradient_accumulation_steps=1,
                          finetuning_type=finetuning_type)
    grads_a, grads_b = _record_grads(a, model_a), _record_grads(b, model_b)
    a.run()
    b.run()
    assert len(grads_a) == len(grads_b) == 2
    for step_a, step_b in zip(grads_a, grads_b, strict=True):
        assert step_a.keys() == step_b.keys() and step_a
        for name in step_a:
            torch.testing.assert_close(step_a[name], step_b[name], rtol=1e-4, atol=1e-6)
    for (name, pa), (_, pb) in zip(model_a.named_parameters(), model_b.named_parameters(),
                                   strict=True):
        if pa.requires_grad:
            torch.testing.assert_close(pa, pb, rtol=0, atol=1e-5, msg=name)


def test_loss_is_normalised_by_the_steps_tokens_not_per_micro_batch(tmp_path, tiny_llama_dir,
                                                                    tiny_tokenizer):
    """Guard for the test above: averaging per micro-batch would give other gradients here."""
    samples = _samples(tiny_tokenizer, 4)
    lengths = {int((s.labels != -100).sum()) for s in samples}
    assert len(lengths) > 1  # the samples really differ in trained tokens
    a, model_a = _trainer(tmp_path / "a", tiny_llama_dir, samples, max_steps=1,
                          per_device_train_batch_size=1, gradient_accumulation_steps=4)
    grads = _record_grads(a, model_a)
    a.run()
    model_a.zero_grad()
    # per-micro-batch mean: sum_i mean_i / 4
    objective = a.objective
    from tunesmith.data.batching import collate

    per_batch = [collate([s], 0) for s in samples]
    model_b = _trainer(tmp_path / "b", tiny_llama_dir, samples, max_steps=1)[1]
    for batch in per_batch:
        (objective.loss_sum(model_b, batch) / batch.n_targets / 4).backward()
    name = next(n for n in grads[0] if "lora_B" in n)  # lora_A has no gradient at step 1
    other = dict(model_b.named_parameters())[name].grad
    assert not torch.allclose(grads[0][name], other, rtol=1e-3, atol=1e-7)


# lagged: a fused optimizer skips on the device and the loop reads the values a step late
LAGGED = {"optim": "adamw_torch_fused", "logging_steps": 100}


@pytest.mark.parametrize("lagged", [False, True])
def test_nonfinite_steps_are_skipped_then_stop(tmp_path, tiny_llama_dir, tiny_tokenizer, lagged):
    samples = _samples(tiny_tokenizer, 8)
    trainer, model = _trainer(tmp_path, tiny_llama_dir, samples, max_steps=6,
                              per_device_train_batch_size=1, max_nonfinite_steps=3,
                              **(LAGGED if lagged else {}))
    assert trainer.lagged == lagged
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    real = trainer.objective.loss_sum
    trainer.objective.loss_sum = lambda m, b: real(m, b) * float("nan")  # poisoned loss
    with pytest.raises(TrainingError, match="3 optimizer steps in a row") as err:
        trainer.run()
    assert "fp16 overflow" in str(err.value) and "learning rate" in str(err.value)
    assert trainer.state.nonfinite_total == 3
    # the scheduler did not advance either; lagged, the step after the third skip had
    # started (skipped on the device too) when the third was read
    assert trainer.scheduler.last_epoch == (1 if lagged else 0)
    for n, p in model.named_parameters():
        if p.requires_grad:
            assert torch.equal(p, before[n]), n  # weights never touched by NaN


@pytest.mark.parametrize("lagged", [False, True])
def test_single_nonfinite_step_is_skipped_and_counted(tmp_path, tiny_llama_dir, tiny_tokenizer,
                                                      lagged):
    samples = _samples(tiny_tokenizer, 8)
    trainer, _ = _trainer(tmp_path, tiny_llama_dir, samples, max_steps=4,
                          per_device_train_batch_size=2, **(LAGGED if lagged else {}))
    assert trainer.lagged == lagged
    poison_call(trainer, 3, float("inf"))
    result = trainer.run()
    assert result.state.nonfinite_total == 1 and result.state.step == 4
    assert trainer.scheduler.last_epoch == 3  # 4 steps, one skipped
    assert math.isfinite(result.state.last_loss)


@pytest.mark.parametrize("arch_fixture", ["tiny_llama_dir", "tiny_qwen2_dir"])
def test_saved_adapter_reloads_to_same_outputs(tmp_path, request, arch_fixture, alpaca_file):
    model_dir = request.getfixturevalue(arch_fixture)
    out = tmp_path / "run"
    cfg = load_config(overrides={"model_name_or_path": str(model_dir), "dataset": str(alpaca_file),
                                 "output_dir": str(out), "max_steps": 3, "learning_rate": 5e-3,
                                 "per_device_train_batch_size": 4, "save_steps": 0})
    run_sft(cfg)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    x = torch.randint(3, 300, (2, 12))
    with torch.no_grad():
        base_logits = base(x).logits
    tuned = PeftModel.from_pretrained(base, out).eval()
    with torch.no_grad():
        tuned_logits = tuned(x).logits
        merged_logits = tuned.merge_and_unload()(x).logits
    assert not torch.allclose(tuned_logits, base_logits, atol=1e-4)  # training changed it
    torch.testing.assert_close(merged_logits, tuned_logits, rtol=1e-5, atol=1e-5)


def test_freeze_trains_only_last_layers(tmp_path, tiny_llama_dir, alpaca_file):
    out = tmp_path / "run"
    cfg = load_config(overrides={"model_name_or_path": str(tiny_llama_dir),
                                 "dataset": str(alpaca_file), "output_dir": str(out),
                                 "max_steps": 2, "finetuning_type": "freeze",
                                 "freeze_trainable_layers": 1, "save_steps": 0})
    run_sft(cfg)
    base = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
    tuned = AutoModelForCausalLM.from_pretrained(out)
    for (name, p0), (_, p1) in zip(base.named_parameters(), tuned.named_parameters(),
                                   strict=True):
        if ".layers.1." in name:
            assert not torch.equal(p0, p1), name
        else:
            assert torch.equal(p0, p1), name


def _fake_oom_above(trainer, max_rows: int) -> list[int]:
    """Make the objective run out of memory for micro-batches of more than `max_rows`."""
    real = trainer.objective.loss_sum
    seen: list[int] = []

    def limited(model, batch):
        seen.append(batch.input_ids.shape[0])
        if batch.input_ids.shape[0] > max_rows:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(model, batch)

    trainer.objective.loss_sum = limited
    return seen


def test_auto_batch_size_backs_off_without_changing_results(tmp_path, tiny_llama_dir,
                                                             tiny_tokenizer):
    samples = _samples(tiny_tokenizer, 8)
    common = dict(max_steps=2, per_device_train_batch_size=2, gradient_accumulation_steps=4)
    auto, model_auto = _trainer(tmp_path / "auto", tiny_llama_dir, samples, auto_batch_size=True,
                                **common)
    plain, model_plain = _trainer(tmp_path / "plain", tiny_llama_dir, samples, **common)
    seen = _fake_oom_above(auto, 2)
    auto.run()
    plain.run()
    assert seen[:3] == [8, 4, 2]  # whole step, then halved twice, then it fits
    assert auto.sizer.size == 2
    for (name, a), (_, b) in zip(model_auto.named_parameters(), model_plain.named_parameters(),
                                 strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)


def test_out_of_memory_without_auto_names_the_settings(tmp_path, tiny_llama_dir,
                                                       tiny_tokenizer):
    samples = _samples(tiny_tokenizer, 8)
    trainer, _ = _trainer(tmp_path, tiny_llama_dir, samples, max_steps=2,
                          per_device_train_batch_size=4)
    _fake_oom_above(trainer, 2)
    with pytest.raises(TrainingError) as err:
        trainer.run()
    text = str(err.value)
    assert "out of memory on cpu in a micro-batch of 4 sample(s)" in text
    for hint in ("gradient_checkpointing: true", "auto_batch_size: true", "cutoff_len"):
        assert hint in text
