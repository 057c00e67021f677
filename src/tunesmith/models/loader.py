"""Load tokenizers and causal language models (safetensors only, remote code off)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from tunesmith.config.environment import hub_offline
from tunesmith.errors import ModelError
from tunesmith.kernels.attention import VARLEN_ATTENTION, register_varlen_attention
from tunesmith.models.processor import is_vision_model

log = logging.getLogger(__name__)


def load_tokenizer(path: str, *, trust_remote_code: bool = False) -> Any:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                            local_files_only=hub_offline())
    except (OSError, ValueError) as exc:
        raise ModelError(f"could not load the tokenizer of {path!r}: {exc}") from None
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token  # padding positions are masked out of attention and loss
    return tok


def load_causal_lm(path: str, *, dtype: torch.dtype = torch.float32,
                   trust_remote_code: bool = False, attn_implementation: str = "sdpa",
                   device: torch.device | str = "cpu") -> torch.nn.Module:
    """Load weights through safetensors; a folder holding only pickle weights is refused.
    tunesmith's own attention functions are registered before transformers checks the name.
    A vision-language model folder loads through transformers' image-text-to-text class."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    vision = is_vision_model(path)
    auto = AutoModelForImageTextToText if vision else AutoModelForCausalLM
    if attn_implementation in ("varlen", VARLEN_ATTENTION):
        # a vision-language model loads with sdpa (its vision tower keeps it) and switches
        # only its language model afterwards (models/acceleration.set_attention)
        attn_implementation = "sdpa" if vision else register_varlen_attention()
    try:
        model = auto.from_pretrained(
            path, dtype=dtype, trust_remote_code=trust_remote_code, use_safetensors=True,
            attn_implementation=attn_implementation, local_files_only=hub_offline())
    except (OSError, ValueError) as exc:
        text = str(exc)
        hint = (" The folder may hold only .bin (pickle) weights, which tunesmith does not load; "
                "convert them to safetensors first." if "safetensors" in text else "")
        raise ModelError(f"could not load model {path!r}: {text}{hint}") from None
    return model.to(device)


def split_causal_lm(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(decoder trunk producing hidden states, output projection) of a causal LM,
    looking through a PEFT wrapper. Both are the live modules (adapters included)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    trunk = base.get_decoder() if hasattr(base, "get_decoder") else None
    if hasattr(getattr(base, "model", None), "visual"):  # vision-language: the whole trunk
        trunk = base.model
    head = base.get_output_embeddings()
    if trunk is None or head is None:
        raise ModelError(f"{type(base).__name__} exposes no decoder/output head; tunesmith needs "
                         "a causal LM with get_decoder() and get_output_embeddings()")
    return trunk, head


def pick_device(requested: str) -> torch.device:
    if requested == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(requested)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ModelError(f"device: {requested!r} was asked for but no CUDA GPU is visible")
    return device
