"""The speed defaults (auto), LLaMA-Factory's speed keys with its meaning, the compile
fallback and cache, steady-state throughput and suggestions that never repeat a setting."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import torch
import yaml

from tiny import build_model
from tunesmith.cli.main import main
from tunesmith.config import load_config
from tunesmith.errors import ConfigError
from tunesmith.kernels.attention import VARLEN_ATTENTION
from tunesmith.kernels.linear_ce import chunked_linear_cross_entropy
from tunesmith.models.acceleration import enable_checkpointing, set_tf32, upcast_norm_weights
from tunesmith.models.compile_cache import open_compile_cache, save_compile_cache
from tunesmith.models.speed import LeverStats, plan_attention, plan_compile
from tunesmith.train.summary import suggestions
from tunesmith.train.throughput import steady_state, warmup_steps

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
DS = str(Path(__file__).resolve().parents[1] / "examples" / "deepspeed") + "/"


def _cfg(**keys):
    return load_config(overrides={"model_name_or_path": "m", **keys})


@pytest.mark.parametrize("keys,device,expected", [
    ({"packing": True, "bf16": True}, CUDA, VARLEN_ATTENTION),
    ({"neat_packing": True, "bf16": True}, CUDA, VARLEN_ATTENTION),
    ({"packing": True}, CUDA, "sdpa"),  # fp32: no flash kernel
    ({"bf16": True}, CUDA, VARLEN_ATTENTION),  # unpacked: padding-free rows
    ({"bf16": True, "padding_free": "false"}, CUDA, "sdpa"),  # padded batches
    ({"bf16": True, "stage": "dpo"}, CUDA, "sdpa"),  # pairs stay padded
    ({"packing": True, "bf16": True}, CPU, "sdpa"),  # CPU runs take sdpa
    ({"flash_attn": "disabled"}, CPU, "eager"),
    ({"flash_attn": "sdpa", "packing": True, "bf16": True}, CUDA, "sdpa"),
    ({"flash_attn": "fa2", "packing": True}, CPU, VARLEN_ATTENTION),  # the reference twin
    ({"flash_attn": "fa3", "bf16": True}, CUDA, VARLEN_ATTENTION),  # padding-free
    ({"flash_attn": "fa3", "bf16": True, "padding_free": "false"}, CUDA, "sdpa"),  # SDPA's
    ({"flash_attn": "fa2", "attn_implementation": "varlen"}, CPU, VARLEN_ATTENTION),
    ({"attn_implementation": "eager", "packing": True, "bf16": True}, CUDA, "eager"),
])
def test_attention_resolution(keys, device, expected):
    assert plan_attention(_cfg(**keys), device).attention == expected


@pytest.mark.parametrize("keys,device,model_type,expected", [
    ({}, CUDA, "qwen2", True),
    ({}, CPU, "qwen2", False),  # CPU runs stay eager by default
    ({}, CUDA, "some_new_arch", False),
    # DeepSpeed compiles too (each layer's forward, ZeRO-3's hooks outside the graph)
    ({"deepspeed": "ds.json"}, CUDA, "llama", True),  # unreadable: load_ds_config says why
    ({"deepspeed": DS + "ds_z3_config.json", "finetuning_type": "full"}, CUDA, "llama", True),
    ({"deepspeed": DS + "ds_z3_config.json", "finetuning_type": "lora"}, CUDA, "llama", True),
    ({"deepspeed": DS + "ds_z2_config.json", "finetuning_type": "lora"}, CUDA, "llama", True),
    ({"torch_compile": True}, CPU, "some_new_arch", True),
    ({"torch_compile": False}, CUDA, "llama", False),
    # selective recompute keeps tensors inductor mutates: eager on a GPU, compiled on CPU
    ({"gradient_checkpointing": "selective"}, CUDA, "qwen2", False),
    ({"gradient_checkpointing": "selective", "torch_compile": True}, CUDA, "qwen2", False),
    ({"gradient_checkpointing": "selective", "torch_compile": True}, CPU, "qwen2", True),
    ({"gradient_checkpointing": "true"}, CUDA, "qwen2", True),
])
def test_compile_resolution(keys, device, model_type, expected):
    cfg = _cfg(**keys)
    plan = plan_attention(cfg, device)
    plan_compile(plan, cfg, device, model_type)
    assert plan.compile is expected and plan.compile_reason


def test_auto_compile_stays_off_where_zero3_hooks_inside_the_layers(tmp_path):
    """A JSON with DeepSpeed's own stage3_module_granularity_threshold hooks modules inside
    each layer: a compiled layer would break at every hook, so auto stays eager."""
    path = tmp_path / "z3.json"
    path.write_text(json.dumps({"zero_optimization": {
        "stage": 3, "stage3_module_granularity_threshold": 0}}))
    cfg = _cfg(deepspeed=str(path), finetuning_type="full")
    plan = plan_attention(cfg, CUDA)
    plan_compile(plan, cfg, CUDA, "llama")
    assert plan.compile is False and "stage3_module_granularity_threshold" in plan.compile_reason


@pytest.mark.parametrize("keys,mode", [
    ({}, "false"),
    ({"disable_gradient_checkpointing": False}, "true"),  # LLaMA-Factory's default, written
    ({"disable_gradient_checkpointing": False, "gradient_checkpointing": "selective"},
     "selective"),
    ({"disable_gradient_checkpointing": True}, "false"),
    ({"use_unsloth_gc": True}, "offload"),
    ({"use_unsloth_gc": True, "gradient_checkpointing": "true"}, "offload"),
])
def test_recompute_keys(keys, mode):
    assert _cfg(**keys).training.gradient_checkpointing == mode


@pytest.mark.parametrize("keys,text", [
    ({"flash_attn": "disabled", "attn_implementation": "sdpa"}, "flash_attn: disabled contradicts"),
    ({"disable_gradient_checkpointing": True, "gradient_checkpointing": "true"},
     "disable_gradient_checkpointing: true contradicts gradient_checkpointing: true"),
    ({"disable_gradient_checkpointing": True, "use_unsloth_gc": True}, "use_unsloth_gc"),
    ({"use_unsloth_gc": True, "gradient_checkpointing": "selective"}, "contradicts"),
    ({"use_reentrant_gc": True, "gradient_checkpointing": "selective"}, "use_reentrant_gc"),
    ({"torch_compile": "maybe"}, "'maybe' is not one of auto, true, false"),
])
def test_contradicting_speed_keys_are_refused(keys, text):
    with pytest.raises(ConfigError, match=text):
        _cfg(**keys)


def _lora_grads(reentrant: bool | None):
    from tunesmith.adapters.setup import prepare_trainable

    model = prepare_trainable(build_model("llama"), _cfg().finetuning, [])
    stats = LeverStats()
    if reentrant is not None:
        enable_checkpointing(model, "true", reentrant=reentrant, stats=stats)
    model.train()
    ids = torch.randint(3, 300, (2, 12))
    model(input_ids=ids, labels=ids).loss.backward()
    grads = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
    return grads, stats


def test_reentrant_recompute_gives_lora_the_same_gradients():
    ref, _ = _lora_grads(None)
    got, stats = _lora_grads(True)
    assert stats.layer_runs == 2 * 2  # two layers, each run forward and again in backward
    for name, grad in ref.items():
        assert got[name] is not None, f"{name}: no gradient under reentrant recompute"
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6)


def test_upcast_layernorm_casts_only_norm_weights():
    model = build_model("qwen2").to(torch.bfloat16)
    assert upcast_norm_weights(model) == 2 * 2 + 1  # two norms per layer + the final norm
    for name, p in model.named_parameters():
        assert (p.dtype == torch.float32) == ("norm" in name), name
    assert upcast_norm_weights(model) == 0  # already fp32: nothing to cast


def test_head_logits_are_fp32_after_the_head():
    """upcast_lmhead_output: the fused loss turns the head's output into fp32 before the
    softmax, exactly LLaMA-Factory's hook (bf16 product, then fp32)."""
    torch.manual_seed(0)
    h = torch.randn(40, 16, dtype=torch.bfloat16)
    w = torch.randn(50, 16, dtype=torch.bfloat16)
    t = torch.randint(0, 50, (40,))
    ref = torch.nn.functional.cross_entropy((h @ w.t()).float(), t, reduction="sum")
    torch.testing.assert_close(chunked_linear_cross_entropy(h, w, t, 16).float(), ref,
                               rtol=1e-5, atol=1e-4)


def test_tf32_on_cpu_warns_and_changes_nothing(caplog):
    before = torch.backends.cuda.matmul.allow_tf32
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        set_tf32(True, CPU)
    assert torch.backends.cuda.matmul.allow_tf32 == before
    assert "tf32: true applies to NVIDIA GPUs" in caplog.text


def _train(tmp_path, model_dir, data, **keys) -> dict:
    cfg = {"model_name_or_path": str(model_dir), "dataset": str(data), "cutoff_len": 64,
           "output_dir": str(tmp_path / "o"), "max_steps": 2, "save_steps": 0,
           "per_device_train_batch_size": 2, "plot_loss": False, **keys}
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    return json.loads((tmp_path / "o" / "run_summary.json").read_text())


def test_llama_factory_speed_keys_through_the_cli(tmp_path, tiny_llama_dir, alpaca_file,
                                                  caplog):
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        sp = _train(tmp_path, tiny_llama_dir, alpaca_file, flash_attn="fa2", neat_packing=True,
                    use_unsloth_gc=True, use_reentrant_gc=True, upcast_layernorm=True,
                    upcast_lmhead_output=True, tf32=True)["speed"]
    assert sp["attention"] == VARLEN_ATTENTION and sp["varlen_calls"]["reference"] >= 4
    assert sp["checkpointing"] == "offload" and sp["reentrant"] is True
    assert sp["layer_runs"] == 2 * 2 * 2 and sp["offloaded_mb"] > 0
    assert sp["upcast_layernorm"] is True and sp["upcast_params"] == 0  # CPU: fp32 already
    assert sp["tf32"] is True and "tf32: true applies to NVIDIA GPUs" in caplog.text
    assert "flash_attn: fa2: no flash kernel on cpu" in caplog.text


def test_compile_failure_falls_back_to_eager_with_one_warning(tmp_path, tiny_llama_dir,
                                                              alpaca_file, caplog,
                                                              monkeypatch):
    from torch._dynamo import list_backends, register_backend

    def broken_backend(gm, example_inputs):
        raise RuntimeError("this backend always fails")

    if "tunesmith_test_broken" not in list_backends(exclude_tags=()):
        register_backend(name="tunesmith_test_broken")(broken_backend)
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    torch._dynamo.reset()
    with caplog.at_level(logging.WARNING, logger="tunesmith"):
        summary = _train(tmp_path, tiny_llama_dir, alpaca_file, torch_compile=True,
                         torch_compile_backend="tunesmith_test_broken")
    torch._dynamo.reset()
    sp = summary["speed"]
    assert summary["steps"] == 2 and "this backend always fails" in sp["compile_fallback"]
    assert sp["compiled_layers"] == 0
    assert caplog.text.count("compiling the decoder layers failed") == 1


def test_unknown_compile_backend_is_a_config_error(tmp_path, tiny_llama_dir, alpaca_file):
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_llama_dir),
                                    "dataset": str(alpaca_file), "output_dir": str(tmp_path),
                                    "torch_compile": True, "torch_compile_backend": "nope"}))
    assert main(["train", str(path), "overwrite_output_dir=true"]) == 1


def test_steady_state_leaves_out_warm_up():
    steps = [(10.0, 100, 50, 1e9), (4.0, 100, 50, 1e9)] + [(1.0, 100, 50, 1e9)] * 6
    assert warmup_steps([s[0] for s in steps]) == 2
    out = steady_state(steps, peak=1e10)
    assert out["steady_tokens_per_s"] == pytest.approx(100.0)
    assert out["steady_mfu"] == pytest.approx(0.1)
    assert out["warmup_steps"] == 2 and out["warmup_s"] == pytest.approx(14.0)
    assert warmup_steps([3.0]) == 0 and warmup_steps([1.0, 1.0]) == 1


@pytest.mark.parametrize("checkpointing", ["false", "true", "selective", "offload"])
@pytest.mark.parametrize("packing", [False, True])
@pytest.mark.parametrize("compile_mode", ["auto", "true", "false"])
def test_suggestions_never_repeat_a_setting(checkpointing, packing, compile_mode):
    cfg = _cfg(gradient_checkpointing=checkpointing, packing=packing,
               torch_compile=compile_mode, bf16=True)
    text = " | ".join(suggestions(cfg, {"steady_mfu": 0.1}, {}, CUDA))
    assert "MFU is 10%" in text
    assert ("gradient_checkpointing: false" in text) == (checkpointing != "false")
    assert ("packing: true" in text) == (not packing)
    assert ("torch_compile is false" in text) == (compile_mode == "false")


def test_compile_cache_round_trip(tmp_path, monkeypatch):
    saved = {}
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setattr(torch.compiler, "save_cache_artifacts", lambda: (b"graphs", None))
    monkeypatch.setattr(torch.compiler, "load_cache_artifacts",
                        lambda data: saved.setdefault("loaded", data))
    first = open_compile_cache(tmp_path, {"model": "x", "batch": (4, 2048)})
    assert not first.loaded
    import os

    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "compile")
    save_compile_cache(first)
    second = open_compile_cache(tmp_path, {"model": "x", "batch": (4, 2048)})
    assert second.loaded and saved["loaded"] == b"graphs"
    other = open_compile_cache(tmp_path, {"model": "x", "batch": (8, 2048)})
    assert not other.loaded  # other settings, other key


def test_compile_cache_keeps_the_users_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert open_compile_cache(tmp_path, {}).folder == tmp_path / "mine"
