"""Serving benchmark: tunesmith's continuous batcher vs transformers' generate (static batches).

    python bench/serve.py --out DIR            # one H200: 7B shape, bf16, random weights
    python bench/serve.py --tiny --out DIR     # CPU smoke run: 2-layer model, short prompts

For each number of concurrent streams (1 / 8 / 32 / 128), every stream sends one prompt of
512 random tokens and receives 256 new tokens (end-of-sequence ignored, so every stream is
256 tokens long). Both systems decode greedily on the same model in the same process:

- tunesmith: the engine `tunesmith api` serves with (ContinuousBatcher: slot KV cache,
  CUDA-graph decode steps), streams opened from one event loop through the server's own
  bridge (serve/streams.py), text assembled as the API does (HTTP itself not included);
- generate: `model.generate` on one static batch of all streams (left-padded, equal
  prompts here), tokens timed by a streamer.

Reported per system and stream count: aggregate output tokens/s, p50/p95 time to first
token, p50/p95 inter-token latency; and tunesmith's speed-up. A warm-up round of each case
runs first (CUDA-graph capture, kernel autotuning) and is not counted. Writes serve.json
and serve.md to --out (default $OUT, else ./bench-out).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from tunesmith.infer.batcher import BatcherOptions, ContinuousBatcher  # noqa: E402
from tunesmith.infer.engine import GenerationParams, HFEngine  # noqa: E402
from tunesmith.serve.streams import BatcherStreams  # noqa: E402

SHAPES = {  # the Llama-2-7B shape, and a tiny one for CPU runs
    "7b": dict(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=32, vocab_size=32000),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512),
}
TARGET_RATIO_32, TARGET_TOKENS_32 = 5.0, 2500.0


@dataclass
class Result:
    system: str
    streams: int
    output_tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    itl_p50_ms: float
    itl_p95_ms: float
    extra: dict = field(default_factory=dict)


def build_tokenizer(vocab: int):
    """A word-level tokenizer with one word per id (t0 t1 ...), built offline."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<eos>": 1} | {f"t{i}": i for i in range(2, vocab)}
    tok = Tokenizer(models.WordLevel(words, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")
    fast.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    return fast


def build_engine(shape: str, device: torch.device, max_len: int) -> HFEngine:
    from transformers import AutoModelForCausalLM, LlamaConfig

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=max_len, pad_token_id=0,
                      eos_token_id=1, bos_token_id=1)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    engine = HFEngine.from_model(model, build_tokenizer(cfg.vocab_size), f"random-{shape}")
    engine.eos_ids = set()  # every stream runs its full length, as in the generate baseline
    return engine


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = int(pos), min(int(pos) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarise(system: str, starts: list[float], stamps: list[list[float]], tokens: int,
              extra: dict) -> Result:
    """stamps[s]: times at which stream s received its tokens."""
    wall = max(s[-1] for s in stamps) - min(starts)
    ttft = [(s[0] - t0) * 1e3 for s, t0 in zip(stamps, starts, strict=True)]
    itl = [(b - a) * 1e3 for s in stamps for a, b in zip(s, s[1:], strict=False)]
    return Result(system, len(stamps), tokens, round(wall, 3), round(tokens / wall, 1),
                  round(percentile(ttft, 0.5), 2), round(percentile(ttft, 0.95), 2),
                  round(percentile(itl, 0.5), 2), round(percentile(itl, 0.95), 2), extra)


def prompts_for(streams: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (streams, length), generator=g).tolist()


def run_tunesmith(batcher: ContinuousBatcher, prompts: list[list[int]], new: int,
                  system: str = "tunesmith") -> Result:
    """All streams opened at once from one event loop, through the API server's bridge."""
    params = GenerationParams(new, temperature=0)
    streams = BatcherStreams(batcher)
    starts, stamps = [0.0] * len(prompts), [[] for _ in prompts]
    counts = [0] * len(prompts)

    async def client(i: int) -> None:
        starts[i] = time.perf_counter()
        async for chunk in streams.open_stream(prompts[i], params):
            stamps[i].append(time.perf_counter())
            if chunk.finish_reason is not None:
                counts[i] = chunk.completion_tokens

    async def all_clients() -> None:
        await asyncio.gather(*[client(i) for i in range(len(prompts))])

    asyncio.run(all_clients())
    extra = {"graphs_captured": len(batcher.runner.captured),
             "graph_fallbacks": batcher.runner.fallbacks, "slots": batcher.slots}
    return summarise(system, starts, stamps, sum(counts), extra)


class StepClock:
    """A generate streamer that only timestamps each step (first put: the prompt)."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.prompt_seen = False

    def put(self, value: torch.Tensor) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        if value.is_cuda:
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def run_generate(engine: HFEngine, prompts: list[list[int]], new: int) -> Result:
    ids = torch.tensor(prompts, device=engine.device)
    clock = StepClock()
    start = time.perf_counter()
    with torch.inference_mode():
        out = engine.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                    max_new_tokens=new, min_new_tokens=new, do_sample=False,
                                    pad_token_id=0, streamer=clock)
    produced = (out.shape[1] - ids.shape[1]) * len(prompts)
    return summarise("generate", [start] * len(prompts), [clock.times] * len(prompts),
                     produced, {})


def write_report(results: list[Result], meta: dict, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    ours = {r.streams: r for r in results if r.system == "tunesmith"}
    peer = {r.streams: r for r in results if r.system == "generate"}
    ratios = {n: round(ours[n].tokens_per_s / peer[n].tokens_per_s, 2)
              for n in ours if n in peer}
    lines = [f"# Serving benchmark ({meta['shape']}, {meta['device']})", "",
             f"prompt {meta['prompt_tokens']} tokens, {meta['new_tokens']} new tokens, greedy; "
             f"torch {meta['torch']}, transformers {meta['transformers']}", "",
             "| system | streams | output tok/s | TTFT p50 ms | TTFT p95 ms | ITL p50 ms "
             "| ITL p95 ms | vs generate |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        ratio = f"{round(r.tokens_per_s / peer[r.streams].tokens_per_s, 2)}x" \
            if r.system != "generate" and r.streams in peer else ""
        lines.append(f"| {r.system} | {r.streams} | {r.tokens_per_s} | {r.ttft_p50_ms} | "
                     f"{r.ttft_p95_ms} | {r.itl_p50_ms} | {r.itl_p95_ms} | {ratio} |")
    if 32 in ratios:
        lines += ["", f"At 32 streams: {ours[32].tokens_per_s} tok/s (target >= "
                  f"{TARGET_TOKENS_32:.0f}), {ratios[32]}x generate (target >= "
                  f"{TARGET_RATIO_32:.0f}x)."]
    table = "\n".join(lines) + "\n"
    (out / "serve.md").write_text(table, encoding="utf-8")
    body = {"meta": meta, "ratios": ratios, "results": [asdict(r) for r in results]}
    (out / "serve.json").write_text(json.dumps(body, indent=2), encoding="utf-8")
    return table


def run_systems(engine: HFEngine, systems: list[str], streams: list[int], prompt_len: int,
                new: int, eager: bool) -> list[Result]:
    """Each system at each stream count: a warm-up round, then the measured one."""
    vocab = engine.model.config.vocab_size
    results: list[Result] = []
    for system in systems:
        batcher = None
        if system.startswith("tunesmith"):
            graphs = system == "tunesmith" and not eager
            batcher = ContinuousBatcher(engine, BatcherOptions(
                max_batch=max(streams), max_len=prompt_len + new, cuda_graphs=graphs))
        for n in streams:
            for round_ in ("warm-up", "measured"):
                prompts = prompts_for(n, prompt_len, vocab, seed=n)
                r = run_tunesmith(batcher, prompts, new, system) if batcher else \
                    run_generate(engine, prompts, new)
                print(f"{system:9s} streams={n:<4d} {round_:8s} {r.tokens_per_s:>9} tok/s "
                      f"TTFT p50 {r.ttft_p50_ms} ms ITL p50 {r.itl_p50_ms} ms", flush=True)
            results.append(r)
        if batcher is not None:
            batcher.close()
        if engine.device.type == "cuda":
            torch.cuda.empty_cache()
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tiny", action="store_true", help="CPU smoke run with a tiny model")
    p.add_argument("--out", default=os.environ.get("OUT") or "bench-out")
    p.add_argument("--streams", default="", help="comma-separated (default 1,8,32,128)")
    p.add_argument("--systems", default="generate,tunesmith",
                   help="any of generate, tunesmith, tunesmith-eager (no CUDA graphs)")
    p.add_argument("--eager", action="store_true", help="tunesmith without CUDA graphs")
    a = p.parse_args(argv)
    unknown = set(a.systems.split(",")) - {"generate", "tunesmith", "tunesmith-eager"}
    if unknown:
        p.error(f"--systems: unknown {sorted(unknown)}; choose generate, tunesmith, "
                "tunesmith-eager")
    device = torch.device("cpu" if a.tiny or not torch.cuda.is_available() else "cuda")
    shape, prompt_len, new = ("tiny", 32, 8) if a.tiny else ("7b", 512, 256)
    streams = [int(s) for s in (a.streams or ("1,4" if a.tiny else "1,8,32,128")).split(",")]
    engine = build_engine(shape, device, max_len=prompt_len + new + 8)
    results = run_systems(engine, a.systems.split(","), streams, prompt_len, new, a.eager)
    import transformers

    meta = {"shape": shape, "device": torch.cuda.get_device_name() if device.type == "cuda"
            else "cpu", "prompt_tokens": prompt_len, "new_tokens": new,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "eager": a.eager}
    print(write_report(results, meta, Path(a.out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
