"""A preallocated KV cache of fixed slots, and the attention function that reads and writes it.

Every running request owns one slot (a row of the cache) and its own position, so requests
of different lengths decode together without padding and join or leave between steps:

```
cache.k[layer]  [S, L, Hkv, D]         one slot per request, the running batch packed at the
                                       front (slots 0..B-1), free slots behind it
prefill  q,k,v [m, H(kv), T, D] --k,v--> k[layer][first:first+m, :T]; causal SDPA on k,v
decode   q [B, H, 1, D], k,v [B, Hkv, 1, D] --index_copy_ at row b * L + pos[b] of the
         flattened cache--> SDPA of q over k[layer][:B, :Lb] with key j visible when j <= pos[b]
```

The function is registered with transformers' AttentionInterface and reads its state from a
keyword argument the model forwards to attention functions, so the model class is used as
it is. Queries of one KV head are folded into the query axis at decode ([B, Hkv, G, D]), so
grouped-query attention needs no repeated keys.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from tunesmith.errors import ModelError, UnsupportedModelError

SLOT_ATTENTION = "tunesmith_slots"
STATE_KWARG = "tunesmith_slots"


@dataclass
class PrefillState:
    """New requests written into slots first..first+m-1 (prompts right-padded to T)."""

    cache: SlotCache
    first: int


@dataclass
class DecodeState:
    """One token per row: row b is slot b at position pos[b]; keys up to `span` are read."""

    cache: SlotCache
    pos: torch.Tensor  # [B] long, on the cache's device
    span: int


class SlotCache:
    """K and V tensors for every layer, allocated once."""

    def __init__(self, layers: int, slots: int, kv_heads: int, length: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        shape = (slots, length, kv_heads, head_dim)
        self.slots, self.length = slots, length
        self.k = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.v = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]

    def move(self, src: int, dst: int, upto: int) -> None:
        """Copy the first `upto` positions of slot src into slot dst (keeps the batch packed)."""
        for k, v in zip(self.k, self.v, strict=True):
            k[dst, :upto].copy_(k[src, :upto])
            v[dst, :upto].copy_(v[src, :upto])


@dataclass(frozen=True)
class CacheShape:
    """Per-token geometry of a model's KV cache."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def bytes_per_token(self) -> int:
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        return 2 * self.layers * self.kv_heads * self.head_dim * itemsize


def cache_shape(config: Any, dtype: torch.dtype, length: int = 0) -> CacheShape:
    """KV geometry from a transformers config; refuses models this cache cannot serve
    (sliding-window layers, unless no request of `length` tokens can exceed the window)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    heads = int(getattr(text, "num_attention_heads", 0) or 0)
    layers = int(getattr(text, "num_hidden_layers", 0) or 0)
    if not heads or not layers:
        raise UnsupportedModelError(f"{type(config).__name__} has no num_attention_heads / "
                         "num_hidden_layers; continuous batching needs a decoder-only model")
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    window = getattr(text, "sliding_window", None) if getattr(
        text, "use_sliding_window", True) else None
    if window and (not length or length > window):
        kinds.add("sliding_attention")
    if kinds != {"full_attention"}:
        raise UnsupportedModelError(f"{type(config).__name__} uses attention layers of kinds "
                         f"{sorted(kinds)}; the slot cache serves full-attention models only")
    head_dim = int(getattr(text, "head_dim", 0) or text.hidden_size // heads)
    kv = int(getattr(text, "num_key_value_heads", 0) or heads)
    return CacheShape(layers, kv, head_dim, dtype)


def plan_slots(shape: CacheShape, length: int, max_slots: int, device: torch.device,
               memory_fraction: float) -> int:
    """How many slots of `length` tokens fit in the share `memory_fraction` of the free
    memory (GPU: after the weights are loaded; CPU: at most a quarter of the available RAM,
    the rest is the model's and everyone else's), up to max_slots."""
    free = _free_bytes(device)
    if device.type != "cuda":
        memory_fraction = min(memory_fraction, 0.25)
    per_slot = shape.bytes_per_token * length
    if free is None:
        return max_slots
    fits = int(free * memory_fraction) // per_slot
    if fits < 1:
        raise ModelError(f"the KV cache needs {per_slot / 2**30:.2f} GiB per request of "
                         f"{length} tokens but only {free / 2**30:.2f} GiB of {device.type} "
                         "memory is free; lower --max_model_len or free memory")
    return min(max_slots, fits)


def _free_bytes(device: torch.device) -> int | None:
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # not reported here (e.g. macOS)
        return None


def register_slot_attention() -> str:
    """Register the slot attention function (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(SLOT_ATTENTION, slot_attention_forward)
    return SLOT_ATTENTION


def slot_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                           value: torch.Tensor, attention_mask: torch.Tensor | None,
                           dropout: float = 0.0, scaling: float | None = None,
                           **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature: q [B, H, T, D] -> ([B, T, H, D], None)."""
    state = kwargs.get(STATE_KWARG)
    if state is None:
        raise ModelError(f"attention {SLOT_ATTENTION!r} was called without its slot state; "
                         "it runs only inside the continuous-batching engine")
    layer = int(module.layer_idx)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    if isinstance(state, PrefillState):
        out = _prefill(state, layer, query, key, value, scale)
    else:
        out = _decode(state, layer, query, key, value, scale)
    return out.transpose(1, 2), None


def _prefill(state: PrefillState, layer: int, q: torch.Tensor, k: torch.Tensor,
             v: torch.Tensor, scale: float) -> torch.Tensor:
    m, _, t, _ = k.shape
    state.cache.k[layer][state.first:state.first + m, :t] = k.transpose(1, 2)
    state.cache.v[layer][state.first:state.first + m, :t] = v.transpose(1, 2)
    groups = q.shape[1] // k.shape[1]
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)  # [m, H, T, D]


def _decode(state: DecodeState, layer: int, q: torch.Tensor, k: torch.Tensor,
            v: torch.Tensor, scale: float) -> torch.Tensor:
    b, h, _, d = q.shape
    kv_heads = k.shape[1]
    kc, vc = state.cache.k[layer], state.cache.v[layer]
    length = kc.shape[1]
    # index_copy_ (no host sync, so it can be captured in a CUDA graph) at (slot b, pos[b])
    flat = torch.arange(b, device=q.device) * length + state.pos  # [B]
    kc.view(-1, kv_heads, d).index_copy_(0, flat, k[:, :, 0])
    vc.view(-1, kv_heads, d).index_copy_(0, flat, v[:, :, 0])
    keys = kc[:b, :state.span].transpose(1, 2)  # [B, Hkv, Lb, D], a view
    values = vc[:b, :state.span].transpose(1, 2)
    visible = torch.arange(state.span, device=q.device)[None, :] <= state.pos[:, None]
    mask = visible[:, None, None, :]  # [B, 1, 1, Lb]
    folded = q.reshape(b, kv_heads, h // kv_heads, d)  # [B, Hkv, G, D]
    out = F.scaled_dot_product_attention(folded, keys, values, attn_mask=mask, scale=scale)
    return out.reshape(b, h, 1, d)
