"""Which transformers architectures become which llama.cpp architecture, and how.

    transformers model_type      GGUF arch   Q/K rows permuted   extra tensors
    llama (Llama, SmolLM)        llama       yes                 -
    mistral                      llama       yes                 -
    qwen2 (Qwen2, Qwen2.5)       qwen2       no                  q/k/v biases
    qwen3                        qwen3       no                  q/k RMSNorm weights

Why the permutation: transformers' Llama applies rotary embeddings in "rotate half" form
(pairs are dimension j and j + d/2 of each head), while llama.cpp's llama kernel rotates
adjacent pairs (2j, 2j + 1). Reordering the output rows of W_q and W_k per head from
[first halves | second halves] to interleaved pairs makes both compute the same attention.
Qwen2/Qwen3 run in llama.cpp with the "neox" (rotate-half) layout, so they need no change.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import torch

from tunesmith.errors import ExportError


@dataclass(frozen=True)
class ArchSpec:
    gguf_arch: str
    permute_qk: bool


SUPPORTED_ARCHS: dict[str, ArchSpec] = {
    "llama": ArchSpec("llama", permute_qk=True),
    "mistral": ArchSpec("llama", permute_qk=True),
    "qwen2": ArchSpec("qwen2", permute_qk=False),
    "qwen3": ArchSpec("qwen3", permute_qk=False),
}

# transformers parameter name -> GGUF tensor name ({i}: layer index)
_GLOBAL_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_LAYER_PATTERN = re.compile(r"^model\.layers\.(\d+)\.(.+)\.(weight|bias)$")


def arch_spec(config: Any) -> ArchSpec:
    """The GGUF layout for a transformers config.

    Raises:
        ExportError: the architecture or its rotary scaling is not supported.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in SUPPORTED_ARCHS:
        raise ExportError(
            f"GGUF export does not support model_type {model_type!r}; supported: "
            f"{', '.join(SUPPORTED_ARCHS)} (Llama, SmolLM, Mistral, Qwen2, Qwen2.5, Qwen3). "
            "Use export_format: hf and convert with llama.cpp's convert_hf_to_gguf.py")
    spec = SUPPORTED_ARCHS[model_type]
    rope_type = rope_parameters(config).get("rope_type") or "default"
    allowed = ("default", "linear", "llama3") if spec.gguf_arch == "llama" else (
        "default", "linear")
    if rope_type not in allowed:
        raise ExportError(
            f"GGUF export: rotary scaling {rope_type!r} of this {model_type} model is not "
            f"written by tunesmith's converter yet (supported here: {', '.join(allowed)}); use "
            "export_format: hf and llama.cpp's convert_hf_to_gguf.py")
    return spec


def rope_parameters(config: Any) -> dict[str, Any]:
    """RoPE settings across transformers versions (rope_parameters, or rope_theta/scaling)."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    scaling = getattr(config, "rope_scaling", None)
    if isinstance(scaling, dict):
        params = {**scaling, **params}
        params.setdefault("rope_type", scaling.get("rope_type") or scaling.get("type"))
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    return params


def llama3_rope_factors(config: Any) -> torch.Tensor:
    """Llama 3.1-style RoPE scaling as llama.cpp stores it: one divisor per rotary frequency
    (tensor `rope_freqs.weight`, [head_dim / 2]). Long wavelengths are divided by `factor`,
    short ones kept, the band between interpolated smoothly."""
    p = rope_parameters(config)
    dim = head_dim(config)
    freqs = float(p["rope_theta"]) ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    factor = float(p["factor"])
    low, high = float(p.get("low_freq_factor", 1.0)), float(p.get("high_freq_factor", 4.0))
    old_context = float(p.get("original_max_position_embeddings", 8192))
    wavelen = 2 * math.pi / freqs
    smooth = (old_context / wavelen - low) / (high - low)
    between = 1.0 / ((1 - smooth) / factor + smooth)
    factors = torch.where(wavelen > old_context / low, torch.full_like(freqs, factor), between)
    return torch.where(wavelen < old_context / high, torch.ones_like(freqs), factors).float()


def head_dim(config: Any) -> int:
    return int(getattr(config, "head_dim", None) or
               config.hidden_size // config.num_attention_heads)


def gguf_tensor_name(hf_name: str) -> str:
    """GGUF name of a transformers parameter.

    Raises:
        ExportError: a parameter the converter does not know (it would be lost).
    """
    if hf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[hf_name]
    match = _LAYER_PATTERN.match(hf_name)
    if match and match.group(2) in _LAYER_NAMES:
        return f"blk.{match.group(1)}.{_LAYER_NAMES[match.group(2)]}.{match.group(3)}"
    raise ExportError(f"GGUF export: parameter {hf_name!r} has no GGUF counterpart in "
                      "tunesmith's converter, so it would be dropped; use export_format: hf")


def interleave_rotary_rows(weight: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Reorder the rows of a Q or K projection (weight [H*D, in] or bias [H*D]) from
    rotate-half pairs to adjacent pairs, per head: rows (j, j + D/2) become (2j, 2j + 1)."""
    rows = weight.shape[0]
    half = rows // n_heads // 2
    grouped = weight.reshape(n_heads, 2, half, *weight.shape[1:])  # [H, 2, D/2, ...]
    return grouped.transpose(1, 2).reshape(weight.shape)  # [H, D/2, 2, ...] -> rows


def prepare_tensor(hf_name: str, tensor: torch.Tensor, spec: ArchSpec, config: Any
                   ) -> torch.Tensor:
    """The tensor as llama.cpp expects it for this architecture."""
    if spec.permute_qk and ".self_attn.q_proj." in hf_name:
        return interleave_rotary_rows(tensor, config.num_attention_heads)
    if spec.permute_qk and ".self_attn.k_proj." in hf_name:
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return interleave_rotary_rows(tensor, heads)
    return tensor
