"""Padding-free (varlen) attention registered with transformers' AttentionInterface.

Packed rows hold several samples back to back; each sample must attend only to itself.

    q, k, v [B, H, T, D] --flatten--> [B*T, H, D] --varlen flash (cu_seqlens)--> [B*T, H, D]

The GPU path is torch's FlashAttention varlen kernel (`torch.nn.attention.varlen`); the
reference twin (any device) runs SDPA once per segment. Segment boundaries arrive as the
`cu_seq_lens_q` / `max_length_q` keyword arguments transformers forwards to attention
functions; without them every row is one causal sequence.
"""

from __future__ import annotations

import inspect
from collections import Counter
from typing import Any

import torch
import torch.nn.functional as F

VARLEN_ATTENTION = "tunesmith_varlen"

# Calls of the registered function by path ("flash" | "reference"). transformers' registry
# holds one function per name for the whole process, so its counts live beside it; the run
# summary reports them as proof that the kernel ran (never a silent fallback).
VARLEN_CALLS: Counter[str] = Counter()


def register_varlen_attention() -> str:
    """Register the attention function (idempotent); returns its `attn_implementation` name.

    No mask function is registered on purpose: transformers then builds no mask at all for
    this implementation, which is what a varlen kernel wants.
    """
    from transformers import AttentionInterface

    # Traceable by torch.compile: the flash path is torch's custom op (cu_seqlens a tensor,
    # the longest segment a symbolic int after one recompile), and the reference twin has a
    # mask form for tracing. A graph break here would make dynamo run a whole checkpointed
    # decoder layer eagerly (checkpoint bodies cannot be split).
    _flash_setup()
    if torch.cuda.is_available():
        native_gqa()
    AttentionInterface.register(VARLEN_ATTENTION, varlen_attention_forward)
    return VARLEN_ATTENTION


def row_cu_seqlens(batch: int, length: int, device: torch.device) -> torch.Tensor:
    """Boundaries when every row is one sequence (no packing)."""
    return torch.arange(0, (batch + 1) * length, length, dtype=torch.int32, device=device)


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor,
                             value: torch.Tensor, attention_mask: torch.Tensor | None,
                             dropout: float = 0.0, scaling: float | None = None,
                             **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature; returns ([B, T, H, D], None)."""
    b, h, t, d = query.shape
    cu = kwargs.get("cu_seq_lens_q")
    max_len = kwargs.get("max_length_q")
    if cu is None and key.shape[2] == t:
        # whole rows (no packing; padding-free left a batch without padding as it was): each
        # row is one causal sequence, where SDPA's fused kernels (cuDNN's on an H200) beat
        # varlen FlashAttention (docs/benchmarks/attn.md); the same math on any device
        out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                             enable_gqa=key.shape[1] != h)
        _count_call("sdpa_rows")
        return out.transpose(1, 2), None
    if cu is None:
        cu, max_len = row_cu_seqlens(b, t, query.device), t
    q = query.transpose(1, 2).reshape(b * t, h, d)  # [B*T, H, D]
    k = key.transpose(1, 2).reshape(b * t, key.shape[1], d)
    v = value.transpose(1, 2).reshape(b * t, value.shape[1], d)
    if not torch.compiler.is_compiling():
        _flash_setup()  # direct calls (tests) that skipped registration
    if query.is_cuda and _FLASH["kernel"] is not None and query.dtype in (torch.bfloat16,
                                                                          torch.float16):
        out = _flash_varlen(q, k, v, cu, max_len, scaling)
        _count_call("flash")
    elif torch.compiler.is_compiling():
        out = varlen_attention_masked(q, k, v, cu, scaling)
    else:
        out = varlen_attention_reference(q, k, v, cu, scaling)
        _count_call("reference")
    return out.reshape(b, t, h, d), None


def _count_call(path: str) -> None:
    if not torch.compiler.is_compiling():  # eager calls only: a traced side effect would
        VARLEN_CALLS[path] += 1            # break the graph inside checkpointed layers


def varlen_attention_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            cu_seqlens: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """The reference twin in traceable form (no data-dependent loop): one SDPA over all N
    tokens with a block-diagonal causal mask. Memory grows as N^2; CPU/compile only.
    q: [N, H, D]; k, v: [N, Hkv, D] -> [N, H, D]."""
    n = q.shape[0]
    groups = q.shape[1] // k.shape[1]
    pos = torch.arange(n, device=q.device)
    segment = torch.searchsorted(cu_seqlens.to(pos.dtype), pos, right=True)  # [N]
    allowed = (segment[:, None] == segment[None, :]) & (pos[:, None] >= pos[None, :])
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1).repeat_interleave(groups, dim=0),
        v.transpose(0, 1).repeat_interleave(groups, dim=0), attn_mask=allowed, scale=scaling)
    return out.transpose(0, 1)


def varlen_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                               cu_seqlens: torch.Tensor, scaling: float | None) -> torch.Tensor:
    """Causal SDPA per segment. q: [N, H, D]; k, v: [N, Hkv, D] -> [N, H, D].

    Each segment goes in as a batch of one ([1, H, L, D]): SDPA's fused kernels (the CPU
    flash kernel among them) take only 4-D inputs, and the 3-D form fell back to the math
    path, which materialises [H, L, L] scores (28 x 8,192^2 fp32 = 7.5 GB for one
    8,192-token row of a 7B-shaped layer)."""
    out = torch.empty_like(q)
    groups = q.shape[1] // k.shape[1]
    bounds = cu_seqlens.tolist()
    for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
        if hi <= lo:
            continue
        qs = q[lo:hi].transpose(0, 1)[None]  # [1, H, L, D]
        ks = k[lo:hi].transpose(0, 1).repeat_interleave(groups, dim=0)[None]
        vs = v[lo:hi].transpose(0, 1).repeat_interleave(groups, dim=0)[None]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scaling)
        out[lo:hi] = o[0].transpose(0, 1)
    return out


def varlen_kernel_available() -> bool:
    """True when this torch ships the varlen FlashAttention kernel (its GPU path)."""
    return _flash_setup()["kernel"] is not None


# torch's varlen kernel and the keyword names it takes (they moved between releases), looked
# up once, eagerly: inspect.signature inside a traced layer would break the graph.
_FLASH: dict[str, Any] = {}


def _flash_setup() -> dict[str, Any]:
    if not _FLASH:
        try:
            from torch.nn.attention.varlen import varlen_attn
        except ImportError:
            varlen_attn = None
        params = frozenset(inspect.signature(varlen_attn).parameters) if varlen_attn else ()
        _FLASH.update(kernel=varlen_attn, params=frozenset(params))
    return _FLASH


def _flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu: torch.Tensor,
                  max_len: int, scaling: float | None) -> torch.Tensor:
    """torch's varlen FlashAttention; its keyword names moved between torch releases."""
    params = _FLASH["params"]
    kw: dict[str, Any] = {"scale": scaling}
    if "window_size" in params:
        kw["window_size"] = (-1, 0)  # causal
    else:
        kw["is_causal"] = True
    if q.shape[1] != k.shape[1]:
        if "enable_gqa" in params:
            kw["enable_gqa"] = True
        elif not _FLASH.get("native_gqa"):  # expanded K and V: 2 x [N, H, D] more per layer
            groups = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    cu = cu.to(torch.int32)
    return _FLASH["kernel"](q, k, v, cu, cu, max_len, max_len, **kw)


def native_gqa() -> bool:
    """Whether torch's varlen kernel takes grouped-query K and V as they are (fewer heads
    than Q), found once, eagerly, on the current GPU.

    FlashAttention itself shares each K/V head among its group of Q heads; releases whose
    `varlen_attn` has no `enable_gqa` keyword still hand K and V to that kernel unchecked.
    Passing them unexpanded saves the two [tokens, heads, dim] copies that backward would
    otherwise keep per layer (3.3 GB for Qwen2.5-7B at 8,192 tokens). The answer comes from
    a small forward and backward against the expanded form; any error or difference means
    K and V are expanded, as before."""
    setup = _flash_setup()
    if "native_gqa" not in setup:
        setup["native_gqa"] = "enable_gqa" in setup["params"] or _probe_native_gqa()
    return setup["native_gqa"]


def _probe_native_gqa(device: str = "cuda") -> bool:
    if _FLASH["kernel"] is None or (device == "cuda" and not torch.cuda.is_available()):
        return False
    gen = torch.Generator(device=device).manual_seed(0)
    q, k, v = (torch.randn(48, heads, 64, device=device, dtype=torch.bfloat16, generator=gen)
               for heads in (4, 2, 2))
    cu = torch.tensor([0, 20, 48], dtype=torch.int32, device=device)
    _FLASH["native_gqa"] = False
    try:
        results = []
        for native in (True, False):
            _FLASH["native_gqa"] = native
            leaves = [t.detach().requires_grad_() for t in (q, k, v)]
            out = _flash_varlen(*leaves, cu, 28, None)
            out.float().square().sum().backward()
            results.append([out.float()] + [t.grad.float() for t in leaves])
    except (RuntimeError, ValueError, TypeError):
        return False
    finally:
        _FLASH.pop("native_gqa", None)
    return all(torch.allclose(a, b, atol=2e-2, rtol=2e-2) for a, b in zip(*results, strict=True))
