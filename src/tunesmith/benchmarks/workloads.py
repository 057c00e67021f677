"""Benchmark model shapes and synthetic data (no downloads: weights are random, built on
the device from a config; tokens follow a fixed-seed Markov chain so the loss can fall)."""

from __future__ import annotations

import math

import numpy as np
import torch

from tunesmith.data.batching import Batch, collate
from tunesmith.data.encode import EncodedSample

SHAPES: dict[str, dict] = {
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                       num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                       tie_word_embeddings=False, max_position_embeddings=131072,
                       rope_theta=1e6, rms_norm_eps=1e-6),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                         num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                         tie_word_embeddings=True, max_position_embeddings=131072,
                         rope_theta=1e6, rms_norm_eps=1e-6),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, vocab_size=512,
                 tie_word_embeddings=False, max_position_embeddings=4096),
}


def build_model(shape: str, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**SHAPES[shape], use_cache=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype, attn_implementation="sdpa")
    return model


def markov_tokens(n_tokens: int, vocab: int, seed: int) -> np.ndarray:
    """Tokens where each one mostly determines the next: learnable, so losses move."""
    rng = np.random.default_rng(seed)
    alphabet = min(vocab, 2000)
    table = rng.integers(0, alphabet, size=alphabet)
    out = np.empty(n_tokens, dtype=np.int64)
    out[0] = 1
    noise = rng.random(n_tokens) < 0.15
    jumps = rng.integers(0, alphabet, size=n_tokens)
    for i in range(1, n_tokens):
        out[i] = jumps[i] if noise[i] else table[out[i - 1]]
    return out


def lognormal_lengths(n: int, seed: int, median: int = 256, sigma: float = 1.0,
                      lo: int = 16, hi: int = 2048) -> list[int]:
    rng = np.random.default_rng(seed)
    raw = rng.lognormal(mean=math.log(median), sigma=sigma, size=n)
    return np.clip(np.round(raw), lo, hi).astype(int).tolist()


def make_samples(lengths: list[int], vocab: int, seed: int) -> list[EncodedSample]:
    """Every token trained (the dense workloads have no prompt)."""
    stream = markov_tokens(sum(lengths), vocab, seed)
    samples, start = [], 0
    for n in lengths:
        ids = stream[start:start + n].astype(np.int32)
        samples.append(EncodedSample(ids, ids.copy()))
        start += n
    return samples


def padded_batches(samples: list[EncodedSample], batch_size: int, pad_id: int) -> list[Batch]:
    return [collate(samples[i:i + batch_size], pad_id)
            for i in range(0, len(samples) - batch_size + 1, batch_size)]


def packed_batches(samples: list[EncodedSample], row_tokens: int, pad_id: int) -> list[Batch]:
    """Padding-free micro-batches of one row of `row_tokens` tokens each, filled first-fit
    in sample order (the order the peers see), each sample keeping its own positions."""
    rows: list[list[EncodedSample]] = [[]]
    used = 0
    for s in samples:
        if used + len(s) > row_tokens:
            rows.append([])
            used = 0
        rows[-1].append(s)
        used += len(s)
    return [pack_row(r, row_tokens, pad_id) for r in rows if r][:-1]  # last row is partial


def pack_row(samples: list[EncodedSample], row_tokens: int, pad_id: int) -> Batch:
    ids = np.full(row_tokens, pad_id, dtype=np.int64)
    pos = np.zeros(row_tokens, dtype=np.int64)
    seg = np.zeros(row_tokens, dtype=np.int64)
    idx_parts, tgt_parts, bounds = [], [], [0]
    start = 0
    for k, s in enumerate(samples, start=1):
        n = len(s)
        ids[start:start + n] = s.input_ids
        pos[start:start + n] = np.arange(n)
        seg[start:start + n] = k
        nxt = s.labels[1:]
        keep = np.flatnonzero(nxt != -100)
        idx_parts.append(keep + start)
        tgt_parts.append(nxt[keep])
        start += n
        bounds.append(start)
    if start < row_tokens:
        pos[start:] = np.arange(row_tokens - start)
        bounds.append(row_tokens)
    lengths = np.diff(bounds)
    return Batch(torch.from_numpy(ids[None]), torch.from_numpy((seg > 0)[None].astype(np.int64)),
                 torch.from_numpy(np.concatenate(idx_parts)),
                 torch.from_numpy(np.concatenate(tgt_parts).astype(np.int64)),
                 int(sum(len(t) for t in tgt_parts)), int(start),
                 position_ids=torch.from_numpy(pos[None]), segment_ids=torch.from_numpy(seg[None]),
                 cu_seqlens=torch.tensor(bounds, dtype=torch.int32), max_seqlen=int(lengths.max()))
