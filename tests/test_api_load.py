"""Bounded load test: 32 concurrent streaming clients x 4 requests against the tiny model.

Every stream must be well formed (role first, one finish reason, usage last, the text the
model gives that prompt alone: outputs of concurrent, continuously batched requests never
mix, also for requests that join a batch while it decodes) and no request may fail.
requests/s and p50/p95 latency are printed and written to load_test.json.
"""

from __future__ import annotations

import asyncio
import json
import platform
import time

import openai

from server_thread import running_server
from tunesmith.infer.engine import GenerationParams, HFEngine
from tunesmith.serve.app import ServerSettings, create_app

CLIENTS, REQUESTS_EACH, MAX_TOKENS = 32, 4, 16
NAME = "tiny-load"
PROMPTS = [f"Question {i}: what is {i} + {i}?" for i in range(8)]


async def _one_request(client: openai.AsyncOpenAI, prompt: str) -> tuple[float, str, dict]:
    start = time.perf_counter()
    stream = await client.chat.completions.create(
        model=NAME, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS,
        temperature=0, stream=True, stream_options={"include_usage": True})
    chunks = [c async for c in stream]
    elapsed = time.perf_counter() - start
    assert chunks[0].choices[0].delta.role == "assistant"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices
                and c.choices[0].finish_reason]
    assert len(finishes) == 1 and finishes[0] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert {c.id for c in chunks} == {chunks[0].id}
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return elapsed, text, chunks[-1].usage.model_dump()


async def _client_loop(base_url: str, cid: int) -> list[tuple[str, float, str, dict]]:
    out = []
    async with openai.AsyncOpenAI(base_url=base_url, api_key="unused", max_retries=0,
                                  timeout=120) as client:
        for r in range(REQUESTS_EACH):
            prompt = PROMPTS[(cid + r) % len(PROMPTS)]
            out.append((prompt, *await _one_request(client, prompt)))
    return out


async def _load(base_url: str) -> tuple[list, float]:
    start = time.perf_counter()
    results = await asyncio.gather(*[_client_loop(base_url, c) for c in range(CLIENTS)])
    return [r for rs in results for r in rs], time.perf_counter() - start


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def test_32_streaming_clients_x_4_requests(tiny_llama_dir, tmp_path):
    engine = HFEngine(str(tiny_llama_dir))
    expected = {p: engine.generate([{"role": "user", "content": p}],
                                   GenerationParams(MAX_TOKENS, temperature=0)) for p in PROMPTS}
    assert len(set(expected.values())) > 1  # distinct answers, so mixing would show
    app = create_app(engine, ServerSettings(NAME))
    with running_server(app) as url:
        results, wall = asyncio.run(_load(url))
    assert app.state.worker.largest_batch > 1  # waiting streams were batched together
    stats = app.state.worker.batcher.stats
    assert stats.joined_running > 0  # requests joined a batch that was already decoding
    assert len(results) == CLIENTS * REQUESTS_EACH
    for prompt, _, text, usage in results:
        assert text == expected[prompt], prompt
        assert usage["completion_tokens"] <= MAX_TOKENS
    latencies = [r[1] for r in results]
    figures = {"clients": CLIENTS, "requests_per_client": REQUESTS_EACH,
               "max_tokens": MAX_TOKENS, "requests": len(results), "wall_s": round(wall, 3),
               "requests_per_s": round(len(results) / wall, 2),
               "p50_latency_s": round(_percentile(latencies, 0.50), 4),
               "p95_latency_s": round(_percentile(latencies, 0.95), 4),
               "completion_tokens": sum(r[3]["completion_tokens"] for r in results),
               "largest_batch": app.state.worker.largest_batch,
               "joined_running": stats.joined_running,
               "machine": f"{platform.machine()} {platform.processor() or ''}".strip()}
    (tmp_path / "load_test.json").write_text(json.dumps(figures, indent=2))
    print(f"\nload test ({tmp_path / 'load_test.json'}): {json.dumps(figures)}")
