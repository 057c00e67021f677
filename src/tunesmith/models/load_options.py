"""How a model and its tokenizer are loaded, from LLaMA-Factory's model keys: hub revision,
fast tokenizer, low-memory loading, RoPE scaling for a longer context, bitsandbytes
quantisation (QLoRA)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from tunesmith.errors import ConfigError, ModelError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    revision: str = "main"
    use_fast_tokenizer: bool = True
    low_cpu_mem_usage: bool = True
    model_max_length: int = 0  # the context to reach; 0: the model's own
    rope_scaling: str = ""  # linear | dynamic | yarn | llama3 | "" (off)
    quantization_bit: int = 0  # 4 | 8 | 0 (off)
    quantization_type: str = "nf4"
    double_quantization: bool = True


def rope_parameters(config: Any, kind: str, target_length: int) -> dict[str, Any] | None:
    """LLaMA-Factory's RoPE scaling: factor = ceil(target / original context); None when the
    target fits already (logged). Sets config.max_position_embeddings to the new length."""
    current = dict(getattr(config, "rope_parameters", None) or
                   getattr(config, "rope_scaling", None) or {})
    old = current.get("original_max_position_embeddings") or getattr(
        config, "max_position_embeddings", None)
    if not old:
        raise ConfigError("rope_scaling: the model's config has no max_position_embeddings")
    if target_length <= old:
        log.warning("rope_scaling %s: model_max_length %d fits the model's context %d; RoPE "
                    "scaling is not applied", kind, target_length, old)
        return None
    factor = float(math.ceil(target_length / old))
    params = {**current, "rope_type": kind, "factor": factor}
    if kind in ("dynamic", "yarn", "llama3"):
        params["original_max_position_embeddings"] = old
    if kind == "llama3":
        params.update(low_freq_factor=1.0, high_freq_factor=4.0)
    config.max_position_embeddings = int(old * factor)
    log.info("rope_scaling %s: factor %.0f, context %d -> %d", kind, factor, old,
             config.max_position_embeddings)
    return params


def apply_rope_scaling(config: Any, opts: LoadOptions) -> None:
    """RoPE scaling to reach opts.model_max_length (the caller fills it: the key, else
    cutoff_len, as LLaMA-Factory does in training)."""
    if not opts.rope_scaling:
        return
    params = rope_parameters(config, opts.rope_scaling, opts.model_max_length)
    if params is None:
        return
    if hasattr(config, "rope_parameters"):
        config.rope_parameters = params
    else:  # transformers before rope_parameters
        config.rope_scaling = params


def quantization_config(opts: LoadOptions, compute_dtype: torch.dtype) -> Any:
    """A transformers BitsAndBytesConfig for quantization_bit 4 / 8, or None."""
    if not opts.quantization_bit:
        return None
    if opts.quantization_bit not in (4, 8):
        raise ConfigError(f"quantization_bit: {opts.quantization_bit} is not supported with "
                          "quantization_method bnb; use 4 or 8")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise ModelError("quantization_bit: needs the bitsandbytes package; pip install "
                         "'tunesmith[bitsandbytes]'") from None
    from transformers import BitsAndBytesConfig

    if opts.quantization_bit == 8:
        return BitsAndBytesConfig(load_in_8bit=True)
    return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=compute_dtype,
                              bnb_4bit_use_double_quant=opts.double_quantization,
                              bnb_4bit_quant_type=opts.quantization_type)
