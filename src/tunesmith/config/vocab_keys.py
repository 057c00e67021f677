"""New tokens and embedding resizing (LLaMA-Factory 0.9.5's add_tokens, add_special_tokens,
new_special_tokens_config, init_special_tokens, resize_vocab)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.fields import opt


@dataclass
class VocabConfig:
    add_tokens: list[str] = opt([], "Plain tokens to add to the tokenizer (comma-separated); "
                                    "the embeddings grow to match.", advanced=True)
    add_special_tokens: list[str] = opt(
        [], "Special tokens to add (never split, e.g. <think>); the embeddings grow to match.",
        advanced=True)
    new_special_tokens_config: str = opt(
        "", "YAML file of special tokens with a description each ({token: description}); "
        "with init_special_tokens desc_init the description initialises the embedding.",
        advanced=True)
    init_special_tokens: Literal["noise_init", "desc_init", "desc_init_w_noise"] = opt(
        "noise_init", "New embedding rows: mean of the old rows plus noise (noise_init), the "
        "mean of the description's token embeddings (desc_init), or that plus noise.",
        advanced=True)
    resize_vocab: bool = opt(
        False, "Grow the embeddings (and output head) to the tokenizer's size, padded to a "
        "multiple of 64; turned on when tokens are added. With LoRA, embed and head are "
        "then trained and saved with the adapter (unless additional_target names others).",
        advanced=True)
