"""DeepSpeed ZeRO-3 on one GPU through the CLI, as LLaMA-Factory's single-GPU examples are
run (`tunesmith train` with a deepspeed key and no launcher): the 1-rank NCCL group forms,
each decoder layer is gathered whole, compiled layers keep ZeRO-3's hooks outside their
graphs, and the losses follow the plain run's. DeepSpeed travels to the GPU machine as
wheels (bench/z3_sweep.sh shows how)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from test_speed_levers import LAYERS, STEPS, run_train

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
Z3 = Path(__file__).resolve().parents[2] / "examples" / "deepspeed" / "ds_z3_config.json"


def _losses(out: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (out / "metrics.jsonl").open()
            if '"loss"' in line and '"eval' not in line]


@pytest.fixture(autouse=True)
def _fresh_dynamo(monkeypatch):
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


@pytest.mark.parametrize("compiled,tuning", [(False, "full"), (True, "full"),
                                             (True, "lora")])
def test_zero3_on_one_gpu_follows_the_plain_run(tmp_path, tiny_llama_dir, alpaca_file,
                                                compiled, tuning):
    pytest.importorskip("deepspeed", reason="carry deepspeed as wheels (bench/z3_sweep.sh)")
    keys = dict(finetuning_type=tuning, bf16=True, torch_compile=compiled, max_grad_norm=1.0)
    plain = run_train(tmp_path / "plain", tiny_llama_dir, alpaca_file, **keys)
    z3 = run_train(tmp_path / "z3", tiny_llama_dir, alpaca_file, deepspeed=str(Z3), **keys)
    sp = z3["speed"]
    assert z3["steps"] == plain["steps"] == STEPS
    assert sp["zero3_whole_layers"] == LAYERS
    assert sp["compile_fallback"] == "" and (sp["compiled_graphs"] > 0) == compiled
    a, b = _losses(tmp_path / "plain" / "out"), _losses(tmp_path / "z3" / "out")
    assert len(a) == len(b) == STEPS
    # bf16 weights under ZeRO-3 against autocast over fp32 weights: close, not equal
    assert all(abs(x - y) < 0.05 * abs(x) for x, y in zip(a, b, strict=True)), (a, b)
