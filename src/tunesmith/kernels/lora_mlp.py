"""SwiGLU MLP with LoRA on its three projections as one autograd function.

    gate = x Wg^T + s_g (x Ag^T) Bg^T        up = x Wu^T + s_u (x Au^T) Bu^T
    h    = silu(gate) * up                    y  = h Wd^T + s_d (h Ad^T) Bd^T

Left to autograd (PEFT's LoRA layers under bf16 autocast), the backward keeps h (and, in
eager mode, a cast copy of every LoRA input) for each token of each layer: with Qwen2.5-7B's
18,944-wide MLP that is 38 KB per token per layer. Here backward keeps only x, gate, up and
the three rank-r products; h is recomputed from gate and up (element-wise, cheap). The frozen
base weights get no gradient; the adapter matrices get theirs in their own dtype (fp32).

Used only for plain LoRA (one active adapter, no dropout, no DoRA or other variant, a plain
nn.Linear base, unmerged): `lora_parts` says None otherwise and the caller keeps the modules'
own forward.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class LoraParts(NamedTuple):
    weight: torch.Tensor  # [out, in] frozen base
    bias: torch.Tensor | None
    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float


def lora_parts(module: torch.nn.Module) -> LoraParts | None:
    """The pieces of a PEFT LoRA linear layer in its plain form, or None when it is anything
    else (not LoRA, merged, disabled, several adapters, dropout, a variant, a quantised or
    fp8 base)."""
    lora_a = getattr(module, "lora_A", None)
    base = getattr(module, "base_layer", None)
    if lora_a is None or type(base) is not torch.nn.Linear:
        return None
    if getattr(module, "merged", False) or getattr(module, "disable_adapters", False):
        return None
    active = getattr(module, "active_adapters", None) or []
    if len(active) != 1 or active[0] not in lora_a:
        return None
    name = active[0]
    if name in getattr(module, "lora_variant", {}) or \
            not isinstance(module.lora_dropout[name], torch.nn.Identity):
        return None
    lora_b = module.lora_B[name]
    if lora_b.bias is not None or lora_a[name].bias is not None:
        return None
    return LoraParts(base.weight, base.bias, lora_a[name].weight, lora_b.weight,
                     float(module.scaling[name]))


def compute_dtype(x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """bf16/fp16 under autocast (as the modules would run), else the base weight's dtype."""
    kind = x.device.type
    if torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _plus(*terms: torch.Tensor, scales: tuple[float, ...] = ()) -> torch.Tensor:
    """sum(scale_i * term_i) in the terms' dtype. Compiled, the sum runs in fp32 and rounds
    once: inductor then fuses it into the element-wise kernel that reads it, where a bf16
    `mm + x` would become an addmm whose x is first copied into the output (a device copy
    per call). Eager, it stays out of place: selective checkpointing refuses mutated matmul
    outputs."""
    scales = scales or (1.0,) * len(terms)
    if torch.compiler.is_compiling():
        total = terms[0].float() * scales[0]
        for t, s in zip(terms[1:], scales[1:], strict=True):
            total = total + t.float() * s
        return total.to(terms[0].dtype)
    total = terms[0] * scales[0] if scales[0] != 1.0 else terms[0]
    for t, s in zip(terms[1:], scales[1:], strict=True):
        total = total + (t * s if s != 1.0 else t)
    return total


def _lora_forward(x: torch.Tensor, p: LoraParts, dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """(x W^T + bias + s (x A^T) B^T, x A^T) for x [N, in]."""
    xa = x @ p.a.to(dtype).t()  # [N, r]
    bias = p.bias.to(dtype) if p.bias is not None else None
    return _plus(F.linear(x, p.weight.to(dtype), bias), xa @ p.b.to(dtype).t(),
                 scales=(1.0, p.scale)), xa


def _lora_backward(dy: torch.Tensor, x: torch.Tensor, xa: torch.Tensor, p: LoraParts,
                   need_dx: bool) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor]:
    """((dx terms), dA, dB) of one LoRA linear for upstream dy [N, out]; the caller sums the
    dx terms (with others, in one fused add when compiled)."""
    dtype = dy.dtype
    dxa = (dy @ p.b.to(dtype)) * p.scale  # [N, r]
    grad_b = (dy.t() @ xa) * p.scale  # [out, r]
    grad_a = dxa.t() @ x  # [r, in]
    dx = (dy @ p.weight.to(dtype), dxa @ p.a.to(dtype)) if need_dx else ()
    return dx, grad_a.to(p.a.dtype), grad_b.to(p.b.dtype)


class _LoraSwiGLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, gate_w, gate_bias, gate_a, gate_b, up_w, up_bias, up_a, up_b,
                down_w, down_bias, down_a, down_b, scales, dtype):
        gate_p = LoraParts(gate_w, gate_bias, gate_a, gate_b, scales[0])
        up_p = LoraParts(up_w, up_bias, up_a, up_b, scales[1])
        down_p = LoraParts(down_w, down_bias, down_a, down_b, scales[2])
        x = x.to(dtype)
        gate, xa_gate = _lora_forward(x, gate_p, dtype)
        up, xa_up = _lora_forward(x, up_p, dtype)
        h = F.silu(gate) * up
        y, ha = _lora_forward(h, down_p, dtype)
        ctx.save_for_backward(x, gate, up, xa_gate, xa_up, ha, gate_w, gate_a, gate_b,
                              up_w, up_a, up_b, down_w, down_a, down_b)
        ctx.scales = scales
        return y

    @staticmethod
    def backward(ctx, dy):
        (x, gate, up, xa_gate, xa_up, ha, gate_w, gate_a, gate_b, up_w, up_a, up_b,
         down_w, down_a, down_b) = ctx.saved_tensors
        s_gate, s_up, s_down = ctx.scales
        dy = dy.to(x.dtype)
        sig = torch.sigmoid(gate)
        silu = gate * sig
        # h = silu(gate) * up, recomputed instead of kept
        dh_terms, grad_down_a, grad_down_b = _lora_backward(
            dy, silu * up, ha, LoraParts(down_w, None, down_a, down_b, s_down), True)
        dh = _plus(*dh_terms)
        d_up = dh * silu
        d_gate = dh * up * sig * (1 + gate * (1 - sig))  # d silu(g)/dg = sig (1 + g (1 - sig))
        need_dx = ctx.needs_input_grad[0]
        dx_gate, grad_gate_a, grad_gate_b = _lora_backward(
            d_gate, x, xa_gate, LoraParts(gate_w, None, gate_a, gate_b, s_gate), need_dx)
        dx_up, grad_up_a, grad_up_b = _lora_backward(
            d_up, x, xa_up, LoraParts(up_w, None, up_a, up_b, s_up), need_dx)
        dx = _plus(*dx_gate, *dx_up) if need_dx else None
        return (dx, None, None, grad_gate_a, grad_gate_b, None, None, grad_up_a, grad_up_b,
                None, None, grad_down_a, grad_down_b, None, None)


def lora_swiglu(x: torch.Tensor, gate: LoraParts, up: LoraParts, down: LoraParts
                ) -> torch.Tensor:
    """down(silu(gate(x)) * up(x)) for x [..., hidden]; the result has x's leading shape."""
    if any(p.bias is not None and p.bias.requires_grad for p in (gate, up, down)):
        raise ValueError("lora_swiglu: trainable base biases are not supported")
    dtype = compute_dtype(x, gate.weight)
    flat = x.reshape(-1, x.shape[-1])
    with torch.autocast(x.device.type, enabled=False):
        y = _LoraSwiGLU.apply(flat, gate.weight, gate.bias, gate.a, gate.b, up.weight, up.bias,
                              up.a, up.b, down.weight, down.bias, down.a, down.b,
                              (gate.scale, up.scale, down.scale), dtype)
    return y.reshape(*x.shape[:-1], y.shape[-1])
