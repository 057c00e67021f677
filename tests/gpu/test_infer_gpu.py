"""The engine and evaluation on a CUDA GPU (bf16): `pytest -m gpu tests/gpu`."""

from __future__ import annotations

import math

import pytest
import torch

from test_eval import write_mmlu
from tunesmith.config import load_config
from tunesmith.evaluation.runner import run_eval
from tunesmith.infer.engine import GenerationParams, HFEngine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CONVS = [[{"role": "user", "content": "hi"}],
         [{"role": "user", "content": "Who are you? Tell me about the quick brown fox."}]]


@pytest.fixture(scope="module")
def cuda_engine(tiny_llama_dir) -> HFEngine:
    return HFEngine(str(tiny_llama_dir), device="cuda")


def test_engine_streams_and_batches_on_cuda(cuda_engine):
    assert next(cuda_engine.model.parameters()).dtype == torch.bfloat16
    params = GenerationParams(12, temperature=0)
    for conv in CONVS:
        streamed = list(cuda_engine.stream_ids(cuda_engine.encode_chat(conv), params))
        single = cuda_engine.generate_texts([conv], params)[0]
        assert "".join(c.text for c in streamed) == single.text
        assert streamed[-1].completion_tokens == single.completion_tokens
    batch = cuda_engine.generate_texts(CONVS, params)
    assert [b.prompt_tokens for b in batch] == [len(cuda_engine.encode_chat(c)) for c in CONVS]
    seeded = GenerationParams(10, temperature=1.0, seed=3)
    assert cuda_engine.generate(CONVS[0], seeded) == cuda_engine.generate(CONVS[0], seeded)


def test_eval_loss_and_benchmark_on_cuda(cuda_engine, tiny_llama_dir, alpaca_file, tmp_path):
    base = {"model_name_or_path": str(tiny_llama_dir), "device": "cuda"}
    loss = run_eval(load_config(overrides=base | {"eval_dataset": str(alpaca_file),
                                                  "per_device_eval_batch_size": 4}),
                    cuda_engine)
    assert math.isfinite(loss["eval_loss"]) and loss["eval_tokens"] > 0
    write_mmlu(tmp_path)
    bench = run_eval(load_config(overrides=base | {"task": "mmlu_test",
                                                   "task_dir": str(tmp_path), "n_shot": 2}),
                     cuda_engine)
    assert bench["overall"]["count"] == 7
