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


# ----- gate and up as one GEMM with their LoRA terms inside it ------------------------------
#
#   [gate | up] = [x | s_g x Ag^T | s_u x Au^T] @ [[Wg, Bg, 0], [Wu, 0, Bu]]^T
#
# The frozen gate and up weights live in one [2I, H + rg + ru] buffer (the base layers'
# weights become views of it: no extra memory); its B columns are refreshed from the
# adapters before each forward pass (`refresh_gate_up`). One GEMM then gives gate and up
# with the rank-r terms summed in its fp32 accumulator: no [tokens, I] LoRA products are
# written and read back. In backward, d_gate and d_up times their halves of the buffer give
# dx's base part together with the adapters' A-side products (dgate Bg, dup Bu). Down is
# packed the same way, with its A as extra rows (`pack_down`).


def pack_gate_up(gate: torch.nn.Module, up: torch.nn.Module) -> torch.Tensor | None:
    """Move the frozen base weights of plain-LoRA `gate` and `up` into one buffer (returned)
    and make each base weight a view of it; None (nothing changed) when they cannot share
    one: other shapes, dtypes or devices, trainable or hooked base weights, a bias on one."""
    g, u = lora_parts(gate), lora_parts(up)
    if g is None or u is None:
        return None
    wg, wu = g.weight, u.weight
    if wg.shape != wu.shape or wg.dtype != wu.dtype or wg.device != wu.device \
            or wg.requires_grad or wu.requires_grad or wg.device.type == "meta" \
            or (g.bias is None) != (u.bias is None) \
            or any(hasattr(m.base_layer, "_hf_hook") for m in (gate, up)):
        return None
    inter, hidden = wg.shape
    rg, ru = g.a.shape[0], u.a.shape[0]
    packed = torch.zeros(2 * inter, hidden + rg + ru, dtype=wg.dtype, device=wg.device)
    packed[:inter, :hidden] = wg.detach()
    packed[inter:, :hidden] = wu.detach()
    gate.base_layer.weight = torch.nn.Parameter(packed[:inter, :hidden], requires_grad=False)
    up.base_layer.weight = torch.nn.Parameter(packed[inter:, :hidden], requires_grad=False)
    refresh_gate_up(packed, g.b, u.b)
    return packed


def refresh_gate_up(packed: torch.Tensor, gate_b: torch.Tensor, up_b: torch.Tensor) -> None:
    """Copy the adapters' current B matrices into the packed buffer's B columns. It writes
    through `.data`, whose version counter is its own: a forward pass saved for backward is
    not invalidated (B does not change within an optimizer step)."""
    inter, width = gate_b.shape[0], packed.shape[1]
    rg, ru = gate_b.shape[1], up_b.shape[1]
    hidden = width - rg - ru
    store = packed.data
    with torch.no_grad():
        store[:inter, hidden:hidden + rg].copy_(gate_b)
        store[inter:, hidden + rg:].copy_(up_b)


def pack_down(down: torch.nn.Module) -> torch.Tensor | None:
    """`down`'s frozen weight [H, I] as the first rows of a [H + r, I] buffer (returned; the
    base weight becomes that view) whose last rows hold A (`refresh_down`): one GEMM gives
    h Wd^T and h A^T in forward, and dh with its LoRA term in backward. None (nothing
    changed) when the weight is trainable, hooked or on the meta device."""
    d = lora_parts(down)
    if d is None or d.weight.requires_grad or d.weight.device.type == "meta" \
            or hasattr(down.base_layer, "_hf_hook"):
        return None
    hidden, inter = d.weight.shape
    packed = torch.zeros(hidden + d.a.shape[0], inter, dtype=d.weight.dtype,
                         device=d.weight.device)
    packed[:hidden] = d.weight.detach()
    down.base_layer.weight = torch.nn.Parameter(packed[:hidden], requires_grad=False)
    refresh_down(packed, d.a)
    return packed


def refresh_down(packed: torch.Tensor, down_a: torch.Tensor) -> None:
    """Copy the adapter's current A into the packed down buffer (through `.data`, as
    `refresh_gate_up`)."""
    with torch.no_grad():
        packed.data[packed.shape[0] - down_a.shape[0]:].copy_(down_a)


def unpack_weights(*modules: torch.nn.Module) -> None:
    """Give each LoRA module a contiguous base weight of its own again."""
    for module in modules:
        weight = module.base_layer.weight
        own = weight.detach().clone(memory_format=torch.contiguous_format)  # one copy
        module.base_layer.weight = torch.nn.Parameter(own, requires_grad=weight.requires_grad)


class _LoraSwiGLUPacked(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, packed, bias, gate_a, gate_b, up_a, up_b, packed_down, down_bias,
                down_a, down_b, scales, dtype, chunks, norm_w, eps):
        inter, hidden = gate_b.shape[0], x.shape[1]
        res = rstd = None
        if norm_w is not None:  # x is the residual stream: the layer's RMSNorm runs here
            res = x
            rstd = torch.rsqrt(res.float().pow(2).mean(-1, keepdim=True) + eps)  # [N, 1]
            x = norm_w * (res.float() * rstd).to(res.dtype)
        x = x.to(dtype)
        a = torch.cat([gate_a, up_a]).to(dtype)  # [rg + ru, H]
        col_scale = torch.cat([x.new_full((gate_a.shape[0],), scales[0]),
                               x.new_full((up_a.shape[0],), scales[1])])
        xs = (x @ a.t()) * col_scale  # [N, rg + ru]: s x A^T
        gu = F.linear(torch.cat([x, xs], dim=1), packed.to(dtype),
                      bias.to(dtype) if bias is not None else None)  # [N, 2I]
        gate, up = gu[:, :inter], gu[:, inter:]
        hd = (F.silu(gate) * up) @ packed_down.to(dtype).t()  # [N, H + rd]: h Wd^T | h Ad^T
        out = hd.shape[1] - down_a.shape[0]
        ha = hd[:, out:].contiguous()  # its own storage: hd is not kept
        y = _plus(hd[:, :out], ha @ down_b.to(dtype).t(), scales=(1.0, scales[2]))
        if down_bias is not None:
            y = y + down_bias.to(dtype)
        # with the norm inside, the residual and its [N, 1] rstd are kept, not the normed x
        ctx.save_for_backward(x if res is None else res, xs, gu, ha, packed, gate_a, up_a,
                              packed_down, down_a, down_b, norm_w, rstd)
        ctx.meta = (inter, hidden, scales, gate_b.dtype, chunks, dtype)
        return y

    @staticmethod
    def backward(ctx, dy):
        (x, xs, gu, ha, packed, gate_a, up_a, packed_down, down_a, down_b, norm_w,
         rstd) = ctx.saved_tensors
        inter, hidden, scales, b_dtype, chunks, dtype = ctx.meta
        rg = gate_a.shape[0]
        dy = dy.to(dtype)
        a = torch.cat([gate_a, up_a]).to(dtype)
        col_scale = torch.cat([dy.new_full((rg,), scales[0]),
                               dy.new_full((up_a.shape[0],), scales[1])])
        dxa_down = (dy @ down_b.to(dtype)) * scales[2]  # [N, rd]
        grad_down_b = ((dy.t() @ ha) * scales[2]).to(down_b.dtype)
        need_dx = ctx.needs_input_grad[0]
        # token chunks: the [n, I] temporaries (dh, h, d_gate, d_up) exist for one chunk at a
        # time; the adapters' gradients are summed over chunks in fp32
        per_row = (dy, dxa_down, gu, x, xs) + ((rstd,) if norm_w is not None else ())
        parts = [torch.tensor_split(t, chunks) for t in per_row]
        dx, sums = [], None
        for dy_c, dxa_c, gu_c, x_c, xs_c, *rstd_c in zip(*parts, strict=True):
            res_c = x_c
            if norm_w is not None:
                x_c = _norm_again(res_c, rstd_c[0], norm_w, dtype)
            dx_c, grads = _packed_backward_rows(
                dy_c, dxa_c, gu_c, x_c, xs_c, packed, packed_down, a, col_scale, inter,
                hidden, rg, need_dx)
            if norm_w is not None and need_dx:
                dx_c = _norm_backward(dx_c, res_c, rstd_c[0], norm_w)
            sums = grads if sums is None else [s + g for s, g in zip(sums, grads, strict=True)]
            dx.append(dx_c)
        grad_down_a, grad_a, grad_gate_b, grad_up_b = sums
        dx = (dx[0] if chunks == 1 else torch.cat(dx)) if need_dx else None
        return (dx, None, None, grad_a[:rg].to(gate_a.dtype), grad_gate_b.to(b_dtype),
                grad_a[rg:].to(up_a.dtype), grad_up_b.to(b_dtype), None, None,
                grad_down_a.to(down_a.dtype), grad_down_b, None, None, None, None, None)


def _norm_again(res: torch.Tensor, rstd: torch.Tensor, weight: torch.Tensor,
                dtype: torch.dtype) -> torch.Tensor:
    """The forward's RMSNorm output from the kept residual and rstd. The product is written
    in another order than the forward's: compiled, the joint graph's CSE would otherwise merge
    the two, and the partitioner could keep the forward's normed x after all."""
    return (weight * (rstd * res.float()).to(res.dtype)).to(dtype)


def _norm_backward(dx: torch.Tensor, res: torch.Tensor, rstd: torch.Tensor,
                   weight: torch.Tensor) -> torch.Tensor:
    """d residual from d normed-x through y = w * (r * rstd), frozen w: rstd (g - r^ mean(g
    r^)) with g = dy w and r^ = r * rstd, in fp32."""
    g = dx.float() * weight.float()
    unit = rstd * res.float()
    return (rstd * (g - unit * (g * unit).mean(-1, keepdim=True))).to(res.dtype)


def _packed_backward_rows(dy, dxa_down, gu, x, xs, packed, packed_down, a, col_scale,
                          inter: int, hidden: int, rg: int, need_dx: bool):
    """The packed MLP's backward for a block of tokens: (dx or None, [dAd, dA, dBg, dBu] in
    fp32). down's dh comes first (it needs no h; one GEMM with its LoRA term inside), so that
    h, d_gate and d_up come out of one element-wise pass over (dh, gate, up)."""
    dh = torch.cat([dy, dxa_down], dim=1) @ packed_down.to(x.dtype)  # [n, I]
    gate, up = gu[:, :inter], gu[:, inter:]
    sig = torch.sigmoid(gate)
    silu = gate * sig
    h = silu * up  # recomputed instead of kept
    d_up = dh * silu
    d_gate = dh * up * sig * (1 + gate * (1 - sig))  # d silu(g)/dg = sig (1 + g (1 - sig))
    grad_down_a = (dxa_down.t() @ h).float()
    w = packed.to(x.dtype)
    # [n, H + R]: dx's base part | dgate Bg, dup Bu (the off-diagonal blocks are zero)
    full = _plus(d_gate @ w[:inter], d_up @ w[inter:])
    dxa = full[:, hidden:] * col_scale  # [n, R]
    dx = _plus(full[:, :hidden], dxa @ a) if need_dx else None
    grads = [grad_down_a, (dxa.t() @ x).float(), (d_gate.t() @ xs[:, :rg]).float(),
             (d_up.t() @ xs[:, rg:]).float()]
    return dx, grads


def lora_swiglu_packed(x: torch.Tensor, packed: torch.Tensor, packed_down: torch.Tensor,
                       gate: LoraParts, up: LoraParts, down: LoraParts,
                       backward_chunks: int = 1,
                       norm: tuple[torch.Tensor, float] | None = None) -> torch.Tensor:
    """`lora_swiglu` with gate and up in one packed buffer (`pack_gate_up`) and down in
    another (`pack_down`), both refreshed from the adapters. `backward_chunks` > 1 runs the
    backward over that many token blocks: its [tokens, I] temporaries shrink by that factor
    (4 of them: 1.2 GB at 8,192 tokens of Qwen2.5-7B as one block, 0.3 GB in four).

    `norm` = (weight, eps) of a frozen Llama-style RMSNorm that `x` (then the residual
    stream) goes through first: backward keeps the residual and a [tokens, 1] rstd instead of
    the normed x, which it recomputes (one [tokens, H] tensor less per layer)."""
    if any(p.bias is not None and p.bias.requires_grad for p in (gate, up, down)):
        raise ValueError("lora_swiglu: trainable base biases are not supported")
    dtype = compute_dtype(x, gate.weight)
    flat = x.reshape(-1, x.shape[-1])
    bias = torch.cat([gate.bias, up.bias]) if gate.bias is not None else None
    with torch.autocast(x.device.type, enabled=False):
        y = _LoraSwiGLUPacked.apply(flat, packed, bias, gate.a, gate.b, up.a, up.b, packed_down,
                                    down.bias, down.a, down.b,
                                    (gate.scale, up.scale, down.scale), dtype,
                                    max(1, backward_chunks), *(norm or (None, 0.0)))
    return y.reshape(*x.shape[:-1], y.shape[-1])
