"""Add tokens to a tokenizer and grow a model's embeddings to match, initialising the new
rows as LLaMA-Factory does (mean + noise, or the mean of a description's embeddings)."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
import yaml

from tunesmith.errors import ConfigError

log = logging.getLogger(__name__)
PAD_MULTIPLE = 64


def read_token_descriptions(path: str) -> dict[str, str]:
    """new_special_tokens_config: a YAML mapping token -> description."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"new_special_tokens_config: {path!r} is not a file")
    data = yaml.safe_load(p.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not all(isinstance(v, str) for v in data.values()):
        raise ConfigError(f"new_special_tokens_config: {path} must map each token to a "
                          "description string")
    return {str(k): v for k, v in data.items()}


def add_vocab_tokens(tokenizer: Any, plain: list[str], special: list[str]) -> int:
    """Add tokens; returns how many were new."""
    added = tokenizer.add_tokens(list(plain)) if plain else 0
    if special:
        added += tokenizer.add_tokens(list(special), special_tokens=True)
    if added:
        log.info("added %d token(s) to the tokenizer (now %d)", added, len(tokenizer))
    return added


@torch.no_grad()
def resize_embeddings(model: torch.nn.Module, tokenizer: Any, init: str = "noise_init",
                      descriptions: dict[str, str] | None = None, seed: int = 0) -> int:
    """Grow input and output embeddings to len(tokenizer) (padded to 64); returns the number
    of new rows (0: already large enough)."""
    old = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) <= old:
        return 0
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=PAD_MULTIPLE)
    new = model.get_input_embeddings().weight.shape[0] - old
    g = torch.Generator(device="cpu").manual_seed(seed)
    described = (_description_rows(model, tokenizer, descriptions, old)
                 if init != "noise_init" else {})
    weights = [model.get_input_embeddings().weight]
    head = model.get_output_embeddings()
    if head is not None and head.weight is not weights[0]:
        weights.append(head.weight)
    for w in weights:
        base = w[:old].mean(dim=0, keepdim=True).expand(new, -1).clone()  # [new, H]
        for token_id, row in described.items():
            base[token_id - old] = row.to(w.dtype)
        if init != "desc_init":
            noise = torch.randn(base.shape, generator=g) / math.sqrt(w.shape[1])
            base += noise.to(w.device, w.dtype)
        w[old:] = base
    log.info("resize_vocab: embeddings %d -> %d rows (%s)", old, old + new, init)
    return new


def _description_rows(model: torch.nn.Module, tokenizer: Any, descriptions: dict | None,
                      old: int) -> dict[int, torch.Tensor]:
    """token id (a new row) -> mean input embedding of its description's old tokens."""
    if not descriptions:
        raise ConfigError("init_special_tokens: desc_init needs new_special_tokens_config "
                          "(token descriptions)")
    embed = model.get_input_embeddings()
    rows: dict[int, torch.Tensor] = {}
    for token, desc in descriptions.items():
        token_id = tokenizer.convert_tokens_to_ids(token)
        if token_id is None or token_id < old:
            continue  # not a new row
        ids = torch.tensor(tokenizer(desc, add_special_tokens=False)["input_ids"])
        ids = ids[ids < old].to(embed.weight.device)
        rows[token_id] = (embed(ids).mean(dim=0) if len(ids)
                          else embed.weight[:old].mean(dim=0))
    return rows
