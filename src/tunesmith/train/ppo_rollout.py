"""PPO rollouts: responses sampled from the policy, and per-token log-probabilities and
values of (query, response) sequences.

    prompts (token ids) --left-pad--> KV-cached decoding, one token per step for every row,
      next token chosen by the inference engine's sampler (infer/sampling.py) --> responses
      (each up to and including its first stop token, at most max_new_tokens)
    [query | response] right-padded --trunk--> hidden [B, L, H]
      rows predicting response tokens --chunked linear log-prob--> logprobs [B, T]
                                      --value head--> values [B, T]       (T: longest response)
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from tunesmith.infer.sampling import RowSampling, choose_tokens
from tunesmith.kernels.linear_logprob import chunked_token_logprobs
from tunesmith.models.loader import split_causal_lm
from tunesmith.train.objective import auto_chunk_rows


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int = 16
    do_sample: bool = True
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0

    def row(self) -> RowSampling:
        return RowSampling(self.temperature if self.do_sample else 0.0, self.top_p, self.top_k,
                           self.repetition_penalty)


@torch.no_grad()
def generate_responses(model: torch.nn.Module, queries: list[list[int]], s: Sampling,
                       stop_ids: set[int], pad_id: int, device: torch.device
                       ) -> list[list[int]]:
    """One sampled response per query (token ids, ending with a stop token unless cut at
    max_new_tokens)."""
    width = max(len(q) for q in queries)
    ids = torch.tensor([[pad_id] * (width - len(q)) + q for q in queries], device=device)
    mask = torch.tensor([[0] * (width - len(q)) + [1] * len(q) for q in queries],
                        device=device)  # [B, Lq] left-padded
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    rows = [s.row() for _ in queries]
    seen = torch.zeros(len(queries), _vocab(model), dtype=torch.bool, device=device)
    seen.scatter_(1, ids, mask.bool())
    out: list[list[int]] = [[] for _ in queries]
    done = [False] * len(queries)
    cache, key = None, cache_argument(model)
    step_ids, step_pos = ids, positions
    for _ in range(s.max_new_tokens):
        res = model(input_ids=step_ids, attention_mask=mask, position_ids=step_pos,
                    use_cache=True, logits_to_keep=1, **{key: cache})
        cache = getattr(res, key)
        chosen = choose_tokens(res.logits[:, -1], rows, seen)
        for i, tok in enumerate(chosen):
            if not done[i]:
                out[i].append(tok)
                done[i] = tok in stop_ids
        if all(done):
            break
        step_ids = torch.tensor(chosen, device=device)[:, None]
        seen.scatter_(1, step_ids, True)
        step_pos = step_pos[:, -1:] + 1
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
    return out


def cache_argument(model: torch.nn.Module) -> str:
    """The KV cache's argument (and output field) name: `cache` from transformers 5.2x on,
    `past_key_values` before."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = inspect.signature(base.forward).parameters
    return "cache" if "cache" in names else "past_key_values"


def _vocab(model: torch.nn.Module) -> int:
    return split_causal_lm(model)[1].weight.shape[0]


@dataclass
class SequenceBatch:
    """[query | response] rows right-padded, and where the response tokens are predicted."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    source: torch.Tensor  # [K] flat row (b * L + t) whose hidden state predicts a token
    dest: torch.Tensor  # [K] flat slot (b * T + t) of [B, T]
    targets: torch.Tensor  # [K] the response tokens
    last: torch.Tensor  # [B] flat row of each sequence's last real token
    mask: torch.Tensor  # [B, T] float: 1 on response tokens
    width: int  # T


def build_sequences(queries: list[list[int]], responses: list[list[int]], pad_id: int,
                    device: torch.device) -> SequenceBatch:
    lengths = [len(q) + len(r) for q, r in zip(queries, responses, strict=True)]
    seq_len, width = max(lengths), max(len(r) for r in responses)
    ids, att, source, dest, targets, last = [], [], [], [], [], []
    mask = torch.zeros(len(queries), width)
    for b, (q, r) in enumerate(zip(queries, responses, strict=True)):
        n = len(q) + len(r)
        ids.append(q + r + [pad_id] * (seq_len - n))
        att.append([1] * n + [0] * (seq_len - n))
        source += [b * seq_len + len(q) - 1 + t for t in range(len(r))]
        dest += [b * width + t for t in range(len(r))]
        targets += r
        last.append(b * seq_len + n - 1)
        mask[b, :len(r)] = 1.0

    def as_tensor(x: list) -> torch.Tensor:
        return torch.tensor(x, dtype=torch.long, device=device)

    return SequenceBatch(as_tensor(ids), as_tensor(att), as_tensor(source), as_tensor(dest),
                         as_tensor(targets), as_tensor(last), mask.to(device), width)


def trunk_rows(model: torch.nn.Module, seqs: SequenceBatch) -> torch.Tensor:
    """Final hidden states of every position, flattened: [B * L, H]."""
    trunk, _ = split_causal_lm(model)
    hidden = trunk(input_ids=seqs.input_ids, attention_mask=seqs.attention_mask,
                   use_cache=False).last_hidden_state  # [B, L, H]
    return hidden.reshape(-1, hidden.shape[-1])


def response_logprobs_values(model: torch.nn.Module, value_head: torch.nn.Module | None,
                             seqs: SequenceBatch, chunk_size: int = 0
                             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """(log-probs [B, T], values [B, T] or None, the response rows' hidden states [K, H])
    of the response tokens, zero on padding; differentiable."""
    _, head = split_causal_lm(model)
    rows = trunk_rows(model, seqs).index_select(0, seqs.source)  # [K, H]
    chunk = chunk_size or auto_chunk_rows(head.weight.shape[0])
    tok = chunked_token_logprobs(rows, head.weight, seqs.targets, chunk)  # [K]
    b = seqs.mask.shape[0]
    logprobs = torch.zeros(b * seqs.width, device=tok.device).index_put(
        (seqs.dest,), tok).view(b, seqs.width)
    values = None
    if value_head is not None:
        v = value_head(rows)  # [K]
        values = torch.zeros(b * seqs.width, device=v.device).index_put(
            (seqs.dest,), v).view(b, seqs.width)
    return logprobs, values, rows


@torch.no_grad()
def response_entropy(rows: torch.Tensor, head: torch.nn.Module, chunk: int = 256
                     ) -> torch.Tensor:
    """Entropy of the next-token distribution at each response row: [K] (chunked logits)."""
    out = []
    for i in range(0, rows.shape[0], chunk):
        logits = (rows[i:i + chunk] @ head.weight.t()).float()
        logp = logits.log_softmax(-1)
        out.append(-(logp.exp() * logp).sum(-1))
    return torch.cat(out) if out else rows.new_zeros(0)
