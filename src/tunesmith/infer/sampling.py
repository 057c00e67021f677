"""Next-token choice for a batch whose rows each carry their own sampling settings.

```
logits [B, V] --repetition penalty (rows' seen tokens)--> --greedy rows: argmax
              --temperature, top-k, top-p per row--> softmax --> one draw per row
                (seeded rows draw from their own torch.Generator, the rest together)
```
The settings mean what they mean in transformers' generate: the penalty divides positive
and multiplies negative logits of tokens already in the prompt or the output; top-k and
top-p keep the smallest set of the most likely tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class RowSampling:
    """One row's settings (temperature 0 = greedy) and, when seeded, its generator."""

    temperature: float
    top_p: float
    top_k: int
    repetition_penalty: float
    generator: torch.Generator | None = None


def choose_tokens(logits: torch.Tensor, rows: list[RowSampling],
                  seen: torch.Tensor | None) -> list[int]:
    """One token id per row. logits [B, V] (any float dtype); seen [B, V] bool or None."""
    logits = logits.float()
    if seen is not None and any(r.repetition_penalty != 1.0 for r in rows):
        logits = _penalise(logits, rows, seen)
    greedy = logits.argmax(dim=-1)
    sampled = [i for i, r in enumerate(rows) if r.temperature > 0]
    if not sampled:
        return greedy.cpu().tolist()  # .cpu() waits for the GPU with the GIL released
    probs = _filtered_probs(logits[sampled], [rows[i] for i in sampled])  # [S, V]
    draws = _draw(probs, [rows[i].generator for i in sampled])
    chosen = greedy.clone()
    chosen[torch.tensor(sampled, device=logits.device)] = draws
    return chosen.cpu().tolist()


def _penalise(logits: torch.Tensor, rows: list[RowSampling], seen: torch.Tensor
              ) -> torch.Tensor:
    penalty = torch.tensor([r.repetition_penalty for r in rows], device=logits.device)[:, None]
    scaled = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, scaled, logits)


def _filtered_probs(logits: torch.Tensor, rows: list[RowSampling]) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p, per row. [S, V] -> [S, V]."""
    dev = logits.device
    temp = torch.tensor([r.temperature for r in rows], device=dev)[:, None]
    logits = logits / temp
    vocab = logits.shape[-1]
    top_k = torch.tensor([r.top_k if 0 < r.top_k < vocab else vocab for r in rows], device=dev)
    top_p = torch.tensor([r.top_p for r in rows], device=dev)[:, None]
    ordered, order = logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=dev)[None, :]
    drop = rank >= top_k[:, None]
    probs = ordered.masked_fill(drop, float("-inf")).softmax(dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the more likely tokens
    drop |= (before >= top_p) & (rank > 0)  # the most likely token always stays
    ordered = ordered.masked_fill(drop, float("-inf"))
    filtered = torch.full_like(logits, float("-inf")).scatter(-1, order, ordered)
    return filtered.softmax(dim=-1)


def _draw(probs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One draw per row; seeded rows use their own generator (reproducible alone or batched)."""
    out = torch.empty(probs.shape[0], dtype=torch.long, device=probs.device)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        idx = torch.tensor(shared, device=probs.device)
        out[idx] = torch.multinomial(probs[idx], 1).squeeze(1)
    for i, g in enumerate(generators):
        if g is not None:
            out[i] = torch.multinomial(probs[i:i + 1], 1, generator=g).squeeze()
    return out
