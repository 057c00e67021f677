"""HF Trainer / LLaMA-Factory run and model keys: data order, length grouping, checkpoint
points, RoPE scaling, quantised loading and the checks that refuse what cannot be honoured."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from tunesmith.config import load_config
from tunesmith.config.run_keys import RunConfig
from tunesmith.config.schema import TrainingConfig
from tunesmith.data.loader import LoaderOptions
from tunesmith.errors import ConfigError
from tunesmith.models.load_options import LoadOptions, rope_parameters
from tunesmith.train.run_setup import check_run_keys
from tunesmith.train.schedule_points import epoch_plan, save_due


def _trainer(n=23, bs=4, **run):
    samples = [list(range((i * 7) % 13 + 1)) for i in range(n)]
    return SimpleNamespace(run_cfg=RunConfig(**run), cfg=TrainingConfig(seed=1), bs=bs,
                           loader=LoaderOptions(), train=samples)


def test_data_seed_orders_the_data_apart_from_seed():
    base = epoch_plan(_trainer(), 0)
    assert epoch_plan(_trainer(data_seed=1), 0) == base  # data_seed = seed: same order
    assert epoch_plan(_trainer(data_seed=9), 0) != base


def test_drop_last_drops_only_the_short_batch():
    plan = epoch_plan(_trainer(), 0)
    dropped = epoch_plan(_trainer(dataloader_drop_last=True), 0)
    assert len(plan[-1]) == 3 and dropped == plan[:-1]


def test_group_by_length_sorts_within_the_megabatch():
    t = _trainer(n=60, bs=3, group_by_length=True)
    plan = epoch_plan(t, 0)
    lengths = [[len(t.train[i]) for i in b] for b in plan]
    assert sorted(i for b in plan for i in b) == list(range(60))
    assert lengths[0][0] == max(max(b) for b in lengths)  # the longest batch first
    flat = [x for b in lengths[1:] for x in b]
    assert flat == sorted(flat, reverse=True)  # one megabatch (60 <= 50 x 3)
    assert epoch_plan(_trainer(n=60, bs=3), 0) != plan


def test_save_strategy_points():
    t = _trainer(save_strategy="epoch")
    t.state = SimpleNamespace(step=3, epoch=1)
    assert save_due(t, start_epoch=0) and not save_due(t, start_epoch=1)
    t.run_cfg = RunConfig(save_strategy="no")
    t.cfg = TrainingConfig(save_steps=1)
    assert not save_due(t, start_epoch=0)
    t.run_cfg = RunConfig(save_strategy="steps")
    assert save_due(t, start_epoch=1)


@pytest.mark.parametrize("kind,extra", [
    ("linear", {}), ("dynamic", {"original_max_position_embeddings": 512}),
    ("yarn", {"original_max_position_embeddings": 512}),
    ("llama3", {"original_max_position_embeddings": 512, "low_freq_factor": 1.0,
                "high_freq_factor": 4.0})])
def test_rope_scaling_follows_llamafactory(kind, extra):
    from transformers import LlamaConfig

    config = LlamaConfig(max_position_embeddings=512)
    params = rope_parameters(config, kind, 1300)
    assert params["rope_type"] == kind and params["factor"] == 3.0  # ceil(1300 / 512)
    assert {k: params[k] for k in extra} == extra
    assert config.max_position_embeddings == 1536
    assert rope_parameters(LlamaConfig(max_position_embeddings=512), kind, 400) is None


def test_rope_scaled_model_equals_transformers_own(tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    from tunesmith.models.loader import load_causal_lm

    ours = load_causal_lm(str(tiny_llama_dir), opts=LoadOptions(rope_scaling="linear",
                                                                model_max_length=1024))
    ref = AutoModelForCausalLM.from_pretrained(
        tiny_llama_dir, rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4})
    ids = torch.arange(40)[None] % 100
    with torch.no_grad():
        torch.testing.assert_close(ours(input_ids=ids).logits, ref(input_ids=ids).logits)
        plain = AutoModelForCausalLM.from_pretrained(tiny_llama_dir)
        assert not torch.allclose(plain(input_ids=ids).logits, ref(input_ids=ids).logits)


def test_quantization_bit_loads_bitsandbytes_layers(tiny_llama_dir):
    import bitsandbytes as bnb

    from tunesmith.models.loader import load_causal_lm

    model = load_causal_lm(str(tiny_llama_dir), opts=LoadOptions(quantization_bit=8))
    assert isinstance(model.model.layers[0].self_attn.q_proj, bnb.nn.Linear8bitLt)


@pytest.mark.parametrize("overrides,message", [
    ({"save_safetensors": False}, "never writes"),
    ({"quantization_bit": 4, "finetuning_type": "full"}, "trains only adapters"),
])
def test_values_that_cannot_be_honoured_stop(overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_run_keys(load_config(overrides=overrides))


def test_ddp_find_unused_parameters_reaches_ddp(tmp_path):
    import torch.distributed as dist

    from tunesmith.distributed.context import DistContext
    from tunesmith.distributed.strategy import Strategy

    owned = not dist.is_initialized()  # an in-process DeepSpeed run keeps its 1-rank group
    if owned:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0,
                                world_size=1)
    try:
        ctx = DistContext(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"))
        strategy = Strategy("ddp", ctx, TrainingConfig(), find_unused_parameters=True)
        strategy.wrap(torch.nn.Linear(2, 2), object())
        assert strategy.loss_module.find_unused_parameters
    finally:
        if owned:
            dist.destroy_process_group()


def _fake_model():
    return torch.nn.Linear(2, 2)


def test_best_tracker_keeps_and_restores_the_best_weights():
    from tunesmith.train.best import BestTracker

    model = _fake_model()
    best = BestTracker(model, RunConfig(load_best_model_at_end=True, early_stopping_steps=2),
                       has_validation=True, sharded=False)
    best.observe(1, 2.0)
    with torch.no_grad():
        model.weight.fill_(0.5)
    best.observe(2, 1.0)  # best: weights 0.5
    with torch.no_grad():
        model.weight.fill_(9.0)
    best.observe(3, 1.5)
    assert not best.stop_early()
    best.observe(4, 1.2)
    assert best.stop_early()  # two evaluations without improvement
    assert best.restore_best() == 2
    assert torch.all(model.weight == 0.5)


def test_greater_is_better_flips_the_order():
    from tunesmith.train.best import BestTracker

    best = BestTracker(_fake_model(), RunConfig(greater_is_better=True), True, False)
    best.observe(1, 1.0)
    best.observe(2, 3.0)
    assert best.best == 3.0 and best.best_step == 2


@pytest.mark.parametrize("run,message", [
    ({"do_eval": True}, "do_eval: needs validation data"),
    ({"load_best_model_at_end": True}, "load_best_model_at_end: needs validation data"),
    ({"metric_for_best_model": "eval_accuracy"}, "is not measured"),
])
def test_evaluation_keys_without_what_they_need_stop(run, message):
    from tunesmith.train.best import BestTracker

    with pytest.raises(ConfigError, match=message):
        BestTracker(_fake_model(), RunConfig(**run), has_validation=False, sharded=False)


def test_early_stopping_through_the_cli(tmp_path, tiny_llama_dir, alpaca_file):
    import json

    from lf_examples import write_run_yaml
    from tunesmith.cli.main import main

    path = write_run_yaml("train_full/qwen3_full_sft.yaml", str(tiny_llama_dir),
                          str(alpaca_file), tmp_path, template="", max_steps=30,
                          learning_rate=1.0, val_size=4, eval_steps=1, per_device_eval_batch_size=4,
                          early_stopping_steps=2, load_best_model_at_end=True, do_eval=True,
                          preprocessing_num_workers=1, dataloader_num_workers=0, deepspeed="",
                          gradient_accumulation_steps=1, save_steps=0, cutoff_len=64,
                          per_device_train_batch_size=4)
    assert main(["train", str(path)]) == 0
    records = [json.loads(x) for x in (tmp_path / "out/metrics.jsonl").read_text().splitlines()]
    evals = [r["eval_loss"] for r in records if "eval_loss" in r]
    assert len(evals) < 31  # stopped early: learning_rate 1.0 makes the loss climb
    assert evals[-1] == pytest.approx(min(evals[:-1]), rel=1e-5)  # final eval: best weights


def test_added_tokens_grow_the_embeddings_with_the_mean(tmp_path):
    from tiny import build_model, build_tokenizer
    from tunesmith.models.vocab import add_vocab_tokens, resize_embeddings

    tok, model = build_tokenizer(), build_model()
    old = model.get_input_embeddings().weight.detach().clone()
    assert add_vocab_tokens(tok, ["zebra"], ["<think>", "</think>"]) == 3
    assert len(tok.tokenize("<think>")) == 1  # special: never split
    new = resize_embeddings(model, tok, "desc_init",
                            {"<think>": "Question answer", "</think>": "assistant"})
    w = model.get_input_embeddings().weight
    assert w.shape[0] % 64 == 0 and new == w.shape[0] - old.shape[0]
    torch.testing.assert_close(w[:old.shape[0]], old)  # old rows untouched
    think = tok.convert_tokens_to_ids("<think>")
    desc_ids = tok("Question answer", add_special_tokens=False)["input_ids"]
    torch.testing.assert_close(w[think], old[desc_ids].mean(0))
    torch.testing.assert_close(w[tok.convert_tokens_to_ids("zebra")], old.mean(0))
    assert model.lm_head.weight.shape[0] == w.shape[0]


def test_special_tokens_through_the_cli(tmp_path, tiny_llama_dir, alpaca_file):
    import json

    from safetensors.torch import load_file

    from lf_examples import EXAMPLES, write_run_yaml
    from tunesmith.cli.main import main

    path = write_run_yaml("train_lora/qwen3_lora_sft.yaml", str(tiny_llama_dir),
                          str(alpaca_file), tmp_path, template="", max_steps=1,
                          new_special_tokens_config=str(EXAMPLES / "extras/multi_tokens/"
                                                                   "tokens_cfg.yaml"),
                          init_special_tokens="desc_init_w_noise", deepspeed="",
                          preprocessing_num_workers=1, dataloader_num_workers=0, save_steps=0,
                          gradient_accumulation_steps=1, cutoff_len=64)
    assert main(["train", str(path)]) == 0
    out = tmp_path / "out"
    vocab = json.loads((out / "tokenizer.json").read_text())["added_tokens"]
    assert "<|START_OF_SVG|>" in {t["content"] for t in vocab}
    saved = load_file(out / "adapter_model.safetensors")
    assert any("embed_tokens" in k for k in saved) and any("lm_head" in k for k in saved)


def test_model_loading_keys_reach_from_pretrained(monkeypatch, tiny_llama_dir):
    from transformers import AutoModelForCausalLM

    from tunesmith.models.loader import load_causal_lm
    from tunesmith.train.run_setup import load_options

    seen = {}
    real = AutoModelForCausalLM.from_pretrained

    def spy(path, **kwargs):
        seen.update(kwargs)
        return real(path, **kwargs)

    monkeypatch.setattr(AutoModelForCausalLM, "from_pretrained", spy)
    cfg = load_config(overrides={"model_revision": "v2", "low_cpu_mem_usage": False,
                                 "rope_scaling": "dynamic", "cutoff_len": 2048})
    opts = load_options(cfg)
    assert opts.model_max_length == 2048  # cutoff_len when model_max_length is unset
    load_causal_lm(str(tiny_llama_dir), opts=opts)
    assert seen["revision"] == "v2" and seen["low_cpu_mem_usage"] is False
    assert seen["config"].rope_parameters["rope_type"] == "dynamic"


def test_neftune_noise_is_bounded_and_only_in_training():
    from tiny import build_model
    from tunesmith.models.neftune import add_neftune

    model = build_model()
    embed = model.get_input_embeddings()
    ids = torch.arange(16)[None]
    clean = embed(ids).detach()
    add_neftune(model, alpha=5.0)
    model.train()
    noisy = embed(ids).detach()
    bound = 5.0 / (16 * 64) ** 0.5
    assert 0 < (noisy - clean).abs().max() <= bound
    model.eval()
    torch.testing.assert_close(embed(ids), clean)


def test_disable_shuffling_keeps_dataset_order():
    plan = epoch_plan(_trainer(n=10, bs=4, disable_shuffling=True), 3)
    assert plan == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert epoch_plan(_trainer(n=10, bs=4), 3) != plan


@pytest.mark.parametrize("strategy,expected", [("steps", [1, 3, 6, 9, 10]),
                                               ("epoch", [1, 4, 8, 10]), ("no", [1, 10])])
def test_logging_strategy_points(strategy, expected):
    from tunesmith.train.schedule_points import log_due

    run = RunConfig(logging_strategy=strategy, logging_first_step=True)
    cfg = TrainingConfig(logging_steps=3)
    assert [s for s in range(1, 11) if log_due(s, cfg, run, 10, steps_per_epoch=4)] == expected
