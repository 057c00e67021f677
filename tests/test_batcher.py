"""Continuous batching: outputs equal single requests, requests join a running batch, and
stop strings, limits, cancellation and per-request sampling stay per request."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from tunesmith.errors import ModelError
from tunesmith.infer.batcher import BatcherOptions, ContinuousBatcher
from tunesmith.infer.engine import GenerationParams, HFEngine
from tunesmith.infer.kv_slots import CacheShape, cache_shape, plan_slots
from tunesmith.infer.sampling import RowSampling, choose_tokens

CONVS = [[{"role": "user", "content": "hi"}],
         [{"role": "user", "content": "Who are you? Tell me about the quick brown fox."}],
         [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}],
         [{"role": "user", "content": "Translate to French: hello world"}]]
GREEDY = GenerationParams(24, temperature=0)


@pytest.fixture(scope="module")
def engine(tiny_llama_dir) -> HFEngine:
    return HFEngine(str(tiny_llama_dir))


@pytest.fixture(scope="module")
def batcher(engine):
    b = ContinuousBatcher(engine, BatcherOptions(max_batch=4, prefill_tokens=64))
    yield b
    b.close()


def _text(chunks) -> str:
    return "".join(c.text for c in chunks)


def _collect(batcher, prompt, params, out: dict, key, started: threading.Event | None = None):
    chunks = []
    for chunk in batcher.stream(prompt, params):
        chunks.append(chunk)
        if started is not None and len(chunks) == 3:
            started.set()
    out[key] = chunks


def test_greedy_outputs_equal_single_requests_even_when_joining_a_running_batch(
        engine, batcher):
    prompts = [engine.encode_chat(c) for c in CONVS]
    alone = [list(engine.stream_ids(p, GREEDY)) for p in prompts]
    out: dict = {}
    running = threading.Event()
    first = threading.Thread(target=_collect, args=(batcher, prompts[1], GREEDY, out, "a",
                                                    running))
    first.start()
    assert running.wait(30)  # the first request is decoding; the others join it now
    late = [threading.Thread(target=_collect, args=(batcher, p, GREEDY, out, i))
            for i, p in enumerate(prompts * 2)]  # 8 requests for 4 slots: some also wait
    for t in late:
        t.start()
    for t in [first, *late]:
        t.join(60)
    assert _text(out["a"]) == _text(alone[1])
    for i in range(8):
        expected = alone[i % 4]
        assert _text(out[i]) == _text(expected), i
        assert out[i][-1].finish_reason == expected[-1].finish_reason
        assert out[i][-1].completion_tokens == expected[-1].completion_tokens
    assert batcher.stats.largest_batch == 4  # full: requests really ran together
    assert batcher.stats.joined_running >= 4
    assert batcher.stats.prefill_groups >= 3  # the 64-token budget split the prompts


def test_limits_stops_and_cancellation_stay_per_request(engine, batcher):
    prompts = [engine.encode_chat(c) for c in CONVS[:3]]
    full = _text(engine.stream_ids(prompts[1], GREEDY))
    stop = full[3:5]
    params = [GenerationParams(5, temperature=0), GenerationParams(24, temperature=0,
                                                                   stop=[stop]),
              GenerationParams(200, temperature=0)]
    cancelled_before = batcher.stats.cancelled
    streams = [batcher.stream(p, q) for p, q in zip(prompts, params, strict=True)]
    third = [next(streams[2]), next(streams[2])]
    streams[2].close()  # this client hangs up; the others go on
    short = list(streams[0])
    assert _text(short) == _text(engine.stream_ids(prompts[0], params[0]))
    assert short[-1].completion_tokens <= 5
    cut = list(streams[1])
    assert _text(cut) == full[: full.find(stop)] and cut[-1].finish_reason == "stop"
    assert all(c.finish_reason is None for c in third)
    deadline = time.monotonic() + 10
    while batcher.stats.cancelled == cancelled_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert batcher.stats.cancelled == cancelled_before + 1


def test_per_request_sampling_in_one_batch(engine, batcher):
    prompt = engine.encode_chat(CONVS[0])
    seeded = GenerationParams(16, temperature=1.0, seed=7)
    out: dict = {}
    threads = [threading.Thread(target=_collect, args=(batcher, prompt, p, out, k))
               for k, p in [("s1", seeded), ("g", GREEDY), ("s2", seeded),
                            ("s3", GenerationParams(16, temperature=1.0, seed=8))]]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert _text(out["s1"]) == _text(out["s2"]) != _text(out["s3"])
    assert _text(out["g"]) == engine.generate(CONVS[0], GREEDY)
    penalised = GenerationParams(16, temperature=0, repetition_penalty=1.8)
    assert _text(batcher.stream(prompt, penalised)) == engine.generate(CONVS[0], penalised)
    assert engine.generate(CONVS[0], penalised) != engine.generate(CONVS[0], GREEDY)


def test_sampling_filters():
    logits = torch.tensor([[0.0, 3.0, 2.9, 1.0], [5.0, 0.0, 4.9, 4.8]])
    rows = [RowSampling(1.0, 1.0, 1, 1.0), RowSampling(1.0, 0.01, 0, 1.0)]
    for _ in range(20):  # top-k 1 and a tiny top-p leave only the most likely token
        assert choose_tokens(logits, rows, None) == [1, 0]
    two = [RowSampling(1.0, 1.0, 2, 1.0, torch.Generator().manual_seed(s)) for s in range(40)]
    drawn = {choose_tokens(logits[:1], [r], None)[0] for r in two}
    assert drawn == {1, 2}  # top-k 2 keeps exactly the two best
    seen = torch.tensor([[False, True, False, False]])
    assert choose_tokens(logits[:1], [RowSampling(0, 1.0, 0, 2.0)], seen) == [2]


def test_requests_that_cannot_fit_and_unsupported_models_are_refused(engine, batcher):
    with pytest.raises(ModelError, match="does not fit a cache slot"):
        batcher.submit([1] * 500, GenerationParams(100), lambda *a: None)
    from transformers import Qwen2Config

    sliding = Qwen2Config(num_hidden_layers=2, use_sliding_window=True,
                          layer_types=["sliding_attention", "full_attention"])
    with pytest.raises(ModelError, match="full-attention models only"):
        cache_shape(sliding, torch.float32)
    from transformers import MistralConfig

    window = MistralConfig(num_hidden_layers=2, sliding_window=256)
    assert cache_shape(window, torch.float32, length=256).layers == 2  # never past the window
    with pytest.raises(ModelError, match="full-attention models only"):
        cache_shape(window, torch.float32, length=4096)
    shape = CacheShape(layers=2, kv_heads=2, head_dim=16, dtype=torch.float32)
    assert shape.bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert plan_slots(shape, 512, 9, torch.device("cpu"), 0.9) == 9
    with pytest.raises(ModelError, match="lower --max_model_len"):
        plan_slots(CacheShape(2, 2, 16, torch.float32), 2**40, 9, torch.device("cpu"), 0.9)


def test_serving_benchmark_tiny_run(tmp_path, monkeypatch):
    import importlib.util
    import json
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "serve.py"
    spec = importlib.util.spec_from_file_location("bench_serve", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "bench_serve", bench)  # dataclasses look it up
    spec.loader.exec_module(bench)
    assert bench.main(["--tiny", "--streams", "3", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "serve.json").read_text())
    rows = {r["system"]: r for r in report["results"]}
    assert rows["tunesmith"]["output_tokens"] == rows["generate"]["output_tokens"] == 3 * 8
    assert report["ratios"]["3"] > 0 and "| tunesmith | 3 |" in (tmp_path / "serve.md").read_text()
