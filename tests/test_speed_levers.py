"""Every speed lever through the real CLI (`tunesmith train <yaml>`), on a tiny model, with
proof in run_summary.json that it took effect: the attention implementation the model ran
and the varlen kernel's calls, the layers checkpointed and their recompute runs, the bytes
offloaded, the layers compiled and the graphs built.

The combinations cover every value of every lever and every pair of attention x recompute
values at least once with packing and compilation (a covering set, not the full product)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tunesmith.cli.main import main
from tunesmith.kernels.attention import VARLEN_ATTENTION

STEPS, BATCH, LAYERS = 2, 2, 2

# (attention, packing, gradient_checkpointing, torch_compile); compiled runs use dynamo
# with the `eager` backend (tracing, guards and graph breaks as with inductor, without its
# code generation, which takes minutes on a CPU); the GPU suite runs inductor.
COMBOS = [
    ("sdpa", False, "false", "false"),
    ("sdpa", True, "selective", "eager"),
    ("eager", True, "true", "false"),
    ("eager", False, "offload", "eager"),
    ("varlen", True, "offload", "false"),
    ("varlen", True, "true", "eager"),
    ("varlen", False, "selective", "false"),
    ("sdpa", True, "true", "false"),
]


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    """Each run starts with dynamo's caches empty, as a new `tunesmith train` process does."""
    import torch

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)  # restored after
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def run_train(tmp_path: Path, model_dir: Path, data: Path, **keys) -> dict:
    cfg = {"model_name_or_path": str(model_dir), "dataset": str(data),
           "output_dir": str(tmp_path / "out"), "overwrite_output_dir": True,
           "max_steps": STEPS, "per_device_train_batch_size": BATCH, "cutoff_len": 64,
           "learning_rate": 1e-3, "logging_steps": 1, "save_steps": 0, "plot_loss": False,
           **keys}
    path = tmp_path / "train.yaml"
    tmp_path.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", str(path)]) == 0
    return json.loads((tmp_path / "out" / "run_summary.json").read_text())


@pytest.mark.parametrize("attention,packing,checkpointing,compile_mode", COMBOS)
def test_lever_takes_effect(tmp_path, tiny_llama_dir, alpaca_file, attention, packing,
                            checkpointing, compile_mode):
    compiled = compile_mode != "false"
    summary = run_train(tmp_path, tiny_llama_dir, alpaca_file, attn_implementation=attention,
                        packing=packing, gradient_checkpointing=checkpointing,
                        torch_compile=compiled,
                        torch_compile_backend=compile_mode if compiled else "inductor")
    sp, data = summary["speed"], summary["data"]
    assert summary["steps"] == STEPS
    # attention: the implementation transformers dispatched on; varlen proves its calls
    assert sp["attention"] == (VARLEN_ATTENTION if attention == "varlen" else attention)
    forwards = LAYERS * STEPS  # one micro-batch per step
    if attention == "varlen" and not compiled:  # traced calls are not counted
        # packed rows: the per-segment reference; whole rows: SDPA's causal path
        path = "reference" if packing else "sdpa_rows"
        assert sp["varlen_calls"].get(path, 0) >= forwards, sp["varlen_calls"]
    elif attention != "varlen":
        assert not sp["varlen_calls"]
    # packing: rows were packed (and only then)
    assert (data.get("packed_rows") is not None) == packing
    # recompute: every layer checkpointed, and its body ran again in backward
    recompute = checkpointing != "false"
    assert sp["checkpointed_layers"] == (LAYERS if recompute else 0)
    if not compiled:
        assert sp["layer_runs"] == (2 * forwards if recompute else 0)
    assert (sp["offloaded_mb"] > 0) == (checkpointing == "offload")
    # offload: the frozen input embedding served every micro-batch from host memory
    assert sp["input_embedding"].startswith("in host memory") == (checkpointing == "offload")
    assert sp["embedding_staged"] == (STEPS if checkpointing == "offload" else 0)
    assert sp["embedding_host_reads"] == 0
    assert sp["lora_inputs_uncast"] == 0  # CPU: no autocast, PEFT's casts are needed
    # compilation: layers compiled, graphs built, no fallback
    assert sp["compile"] == compiled and sp["compile_fallback"] == ""
    assert sp["compiled_layers"] == (LAYERS if compiled else 0)
    assert (sp["compiled_graphs"] > 0) == compiled
    perf = summary["performance"]
    assert perf["steady_steps"] + perf["warmup_steps"] == STEPS
    assert sp["time_to_first_step_s"] > 0
    assert (sp.get("compile_s") is not None) == compiled


def test_varlen_and_packing_from_the_issue_command(tmp_path, tiny_llama_dir, alpaca_file):
    """The issue's failing command: attn_implementation=varlen packing=true max_steps=2 as
    command-line overrides (it crashed at model load before the registration moved)."""
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"model_name_or_path": str(tiny_llama_dir),
                                    "dataset": str(alpaca_file), "cutoff_len": 64,
                                    "output_dir": str(tmp_path / "o"), "save_steps": 0}))
    assert main(["train", str(path), "attn_implementation=varlen", "packing=true",
                 "max_steps=2"]) == 0
    summary = json.loads((tmp_path / "o" / "run_summary.json").read_text())
    assert summary["speed"]["varlen_calls"]["reference"] >= 2 * LAYERS


def test_lagged_steps_through_the_cli(tmp_path, tiny_qwen2_dir, alpaca_file):
    """A fused optimizer (AdamW on CUDA by default; asked for here on the CPU) takes steps
    without a host sync, with recompute, offload and compilation on, LoRA with the packed
    fused MLP; its losses equal the synchronous run's."""
    keys = {"finetuning_type": "lora", "lora_target": "all", "max_steps": 4,
            "logging_steps": 2, "packing": True, "gradient_checkpointing": "offload",
            "torch_compile": True, "torch_compile_backend": "eager"}
    lagged = run_train(tmp_path / "lagged", tiny_qwen2_dir, alpaca_file,
                       optim="adamw_torch_fused", **keys)
    synced = run_train(tmp_path / "synced", tiny_qwen2_dir, alpaca_file, optim="adamw_torch",
                       **keys)
    assert lagged["speed"]["lagged_steps"] is True and synced["speed"]["lagged_steps"] is False
    for summary in (lagged, synced):
        assert summary["steps"] == 4 and summary["speed"]["offloaded_mb"] > 0
        assert summary["speed"]["fused_lora_mlps"] == 2  # both layers' MLPs, packed

    def losses(name):
        lines = (tmp_path / name / "out" / "metrics.jsonl").read_text().splitlines()
        return [(r["step"], r["loss"]) for r in map(json.loads, lines) if "loss" in r]

    got, want = losses("lagged"), losses("synced")
    assert [s for s, _ in got] == [s for s, _ in want] == [2, 4]
    assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-5)
