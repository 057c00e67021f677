"""The continuous batcher on a CUDA GPU (bf16): CUDA-graph decode steps give the same tokens
as eager ones, and the KV cache is sized from free memory. `pytest -m gpu tests/gpu`."""

from __future__ import annotations

import pytest
import torch

from tunesmith.infer.batcher import BatcherOptions, ContinuousBatcher
from tunesmith.infer.engine import GenerationParams, HFEngine

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]
CONVS = [[{"role": "user", "content": "hi"}],
         [{"role": "user", "content": "Who are you? Tell me about the quick brown fox."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}],
         [{"role": "user", "content": "Translate to French: hello world"}]]


def test_graph_decode_equals_eager_decode(tiny_llama_dir):
    engine = HFEngine(str(tiny_llama_dir), device="cuda")
    engine.eos_ids = set()
    texts = {}
    for graphs in (False, True):
        batcher = ContinuousBatcher(engine, BatcherOptions(max_batch=4, cuda_graphs=graphs))
        params = GenerationParams(24, temperature=0)
        with engine._lock:  # all four wait, so they are prefilled together: same schedule
            streams = [batcher.stream(engine.encode_chat(c), params) for c in CONVS]
        texts[graphs] = ["".join(c.text for c in s) for s in streams]
        if graphs:
            assert batcher.runner.captured and batcher.runner.fallbacks == 0
        assert batcher.stats.largest_batch == 4
        batcher.close()
    assert texts[True] == texts[False]


def test_kv_cache_is_sized_from_free_memory(tiny_llama_dir):
    engine = HFEngine(str(tiny_llama_dir), device="cuda")
    batcher = ContinuousBatcher(engine, BatcherOptions(max_batch=100_000, max_len=512,
                                                       memory_fraction=0.01))
    free, _ = torch.cuda.mem_get_info()
    per_slot = batcher.cache.k[0][0].numel() * 2 * 2 * len(batcher.cache.k)
    assert 1 <= batcher.slots < 100_000
    assert batcher.slots * per_slot <= 0.011 * (free + batcher.slots * per_slot)
    batcher.close()
