"""Fused RMSNorm and SwiGLU modules swapped into a model by a per-architecture table.

Each module holds the original weights/projections, so saved models and adapters are
unchanged; the fused op comes from liger-kernel when installed (`enable_liger_kernel`) and
falls back to the plain reference computation otherwise.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

from tunesmith.kernels.lora_mlp import (
    lora_parts,
    lora_swiglu,
    lora_swiglu_packed,
    pack_down,
    pack_gate_up,
    refresh_down,
    refresh_gate_up,
    unpack_weights,
)

# Eager calls of the fused LoRA MLP (compiled calls are not counted: a side effect would
# break the graph); the run summary reports them as proof that the path ran.
LORA_MLP_CALLS: Counter[str] = Counter()


@lru_cache(maxsize=1)
def liger_ops() -> dict[str, Any] | None:
    """liger-kernel's autograd functions, or None when the package is missing."""
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        from liger_kernel.ops.swiglu import LigerSiLUMulFunction
    except ImportError:
        return None
    return {"rms_norm": LigerRMSNormFunction, "silu_mul": LigerSiLUMulFunction}


def liger_runs_on(x: torch.Tensor) -> bool:
    """liger-kernel's Triton ops need a GPU tensor (its kernels do not run under Triton's CPU
    interpreter); elsewhere the modules compute the reference ops."""
    return x.is_cuda


def rms_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama-style RMSNorm: normalise in fp32, scale by the weight in the input dtype."""
    dtype = x.dtype
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * y.to(dtype)


class FusedRMSNorm(torch.nn.Module):
    def __init__(self, weight: torch.nn.Parameter, eps: float, use_liger: bool):
        super().__init__()
        self.weight = weight
        self.variance_epsilon = eps
        self.use_liger = use_liger and liger_ops() is not None

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.use_liger and liger_runs_on(hidden_states):
            # casting mode "llama" matches rms_norm_reference
            return liger_ops()["rms_norm"].apply(hidden_states, self.weight,
                                                 self.variance_epsilon, 0.0, "llama", False)
        return rms_norm_reference(hidden_states, self.weight, self.variance_epsilon)


class FusedSwiGLUMLP(torch.nn.Module):
    """down(silu(gate(x)) * up(x)) with the original (possibly LoRA-wrapped) projections.
    With `fuse_lora`, plain LoRA projections run as one autograd function that keeps less
    for backward (kernels/lora_mlp.py); anything else runs the modules' own forward."""

    def __init__(self, mlp: torch.nn.Module, use_liger: bool, fuse_lora: bool = False):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = mlp.gate_proj, mlp.up_proj, mlp.down_proj
        self.use_liger = use_liger and liger_ops() is not None
        self.fuse_lora = fuse_lora
        self.backward_chunks = 1  # token blocks of the packed path's backward
        # (norm, decoder layer) when the layer's post-attention RMSNorm runs in this module
        # (`defer_norm`): not submodules, the layer keeps the norm's weight under its name
        self.deferred_norm: tuple = ()
        self.original = (mlp,)  # a tuple: not a submodule (no second copy in state dicts)
        # frozen weights packed with adapter slots (pack_gate_up, pack_down); not saved, not
        # broadcast
        self.register_buffer("packed_gate_up", None, persistent=False)
        self.register_buffer("packed_down", None, persistent=False)

    def pack(self) -> bool:
        """Pack gate's and up's frozen weights in one buffer and down's in another, for the
        path where each is one GEMM with its LoRA terms inside; both or neither."""
        if self.packed_gate_up is None and lora_parts(self.down_proj) is not None:
            self.packed_gate_up = pack_gate_up(self.gate_proj, self.up_proj)
            if self.packed_gate_up is not None:
                self.packed_down = pack_down(self.down_proj)
                if self.packed_down is None:
                    self.unpack()
        return self.packed_gate_up is not None

    def unpack(self) -> None:
        if self.packed_gate_up is not None:
            unpack_weights(self.gate_proj, self.up_proj)
            self.packed_gate_up = None
        if self.packed_down is not None:
            unpack_weights(self.down_proj)
            self.packed_down = None

    def refresh(self) -> None:
        """The packed buffers' adapter slots from the adapters' current B (gate, up) and A
        (down); runs before each pass through the model."""
        gate, up, down = (lora_parts(self.gate_proj), lora_parts(self.up_proj),
                          lora_parts(self.down_proj))
        if self.packed_gate_up is not None and gate is not None and up is not None:
            refresh_gate_up(self.packed_gate_up, gate.b, up.b)
        if self.packed_down is not None and down is not None:
            refresh_down(self.packed_down, down.a)

    def defer_norm(self, layer: torch.nn.Module) -> bool:
        """Run `layer.post_attention_layernorm` here instead of in the layer (which then
        passes the residual stream straight to this module): the packed path's backward
        keeps the residual instead of the normed x. Only for a frozen Llama-style RMSNorm
        whose output feeds nothing but this MLP (the decoder layers of `FUSABLE`)."""
        norm = getattr(layer, "post_attention_layernorm", None)
        if self.deferred_norm or self.packed_gate_up is None or norm is None \
                or type(norm).__name__ not in _DEFERRABLE_NORMS or norm.weight.requires_grad:
            return False
        layer.post_attention_layernorm = NormInMLP(norm.weight)
        self.deferred_norm = (norm, layer)
        return True

    def restore_norm(self) -> None:
        if self.deferred_norm:
            norm, layer = self.deferred_norm
            layer.post_attention_layernorm = norm
            self.deferred_norm = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm = self.deferred_norm[0] if self.deferred_norm else None
        if self.fuse_lora:
            parts = (lora_parts(self.gate_proj), lora_parts(self.up_proj),
                     lora_parts(self.down_proj))
            if parts[0] is not None and parts[1] is not None and parts[2] is not None:
                if not torch.compiler.is_compiling():
                    LORA_MLP_CALLS["packed" if self.packed_gate_up is not None else "eager"] += 1
                if self.packed_gate_up is not None:
                    return lora_swiglu_packed(x, self.packed_gate_up, self.packed_down, *parts,
                                              backward_chunks=self.backward_chunks,
                                              norm=_norm_args(norm))
                return lora_swiglu(norm(x) if norm is not None else x, *parts)
        if norm is not None:  # any other path (adapters off, unpacked) runs the norm first
            x = norm(x)
        gate, up = self.gate_proj(x), self.up_proj(x)
        if self.use_liger and liger_runs_on(x):
            return self.down_proj(liger_ops()["silu_mul"].apply(gate, up))
        return self.down_proj(F.silu(gate) * up)


def _norm_args(norm: torch.nn.Module | None) -> tuple[torch.Tensor, float] | None:
    if norm is None:
        return None
    return norm.weight, getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))


class NormInMLP(torch.nn.Module):
    """Stands in a decoder layer for a post-attention RMSNorm that its FusedSwiGLUMLP runs
    (`FusedSwiGLUMLP.defer_norm`): passes the residual stream through, and holds the norm's
    weight under the norm's name, so state dicts and exports are unchanged."""

    def __init__(self, weight: torch.nn.Parameter):
        super().__init__()
        self.weight = weight

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states


# model_type -> (RMSNorm class name, MLP class name) whose modules can be swapped
FUSABLE: dict[str, tuple[str, str]] = {
    "llama": ("LlamaRMSNorm", "LlamaMLP"),
    "mistral": ("MistralRMSNorm", "MistralMLP"),
    "qwen2": ("Qwen2RMSNorm", "Qwen2MLP"),
    "qwen3": ("Qwen3RMSNorm", "Qwen3MLP"),
    # vision-language models: the language model's modules (Qwen2.5-VL's norm class is
    # shared with its vision tower, where the swap computes the same RMSNorm)
    "qwen2_vl": ("Qwen2VLRMSNorm", "Qwen2MLP"),
    "qwen2_5_vl": ("Qwen2_5_VLRMSNorm", "Qwen2MLP"),
    "qwen3_vl": ("Qwen3VLTextRMSNorm", "Qwen3VLTextMLP"),
}


# RMSNorms computing rms_norm_reference exactly (normalise in fp32, scale in the input dtype)
_DEFERRABLE_NORMS = {names[0] for names in FUSABLE.values()} | {"FusedRMSNorm"}


def _children(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent, name, child) for every module below `model`, listed before any swap."""
    return [(parent, name, child) for parent in list(model.modules())
            for name, child in list(parent.named_children())]


def swap_fused_modules(model: torch.nn.Module, use_liger: bool) -> int:
    """Replace RMSNorm and SwiGLU MLP modules in place; returns how many were swapped."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = FUSABLE.get(getattr(base.config, "model_type", ""))
    if names is None:
        return 0
    norm_cls, mlp_cls = names
    swapped = 0
    for parent, child_name, child in _children(base):
        kind = type(child).__name__
        if kind == norm_cls:
            eps = getattr(child, "variance_epsilon", getattr(child, "eps", 1e-6))
            setattr(parent, child_name, FusedRMSNorm(child.weight, eps, use_liger))
            swapped += 1
        elif kind == mlp_cls and getattr(base.config, "hidden_act", "silu") == "silu":
            setattr(parent, child_name, FusedSwiGLUMLP(child, use_liger))
            swapped += 1
    return swapped


def fuse_lora_mlps(model: torch.nn.Module, pack: bool = True, backward_chunks: int = 1) -> int:
    """Turn on the fused LoRA path of every SwiGLU MLP whose three projections are plain LoRA
    layers (swapping in FusedSwiGLUMLP where liger has not already); returns how many. With
    `pack`, gate and up share one weight buffer and run as one GEMM (`pack_gate_up`), whose
    backward runs over `backward_chunks` token blocks."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    names = FUSABLE.get(getattr(base.config, "model_type", ""))
    if names is None or getattr(base.config, "hidden_act", "silu") != "silu":
        return 0
    fused = 0
    for parent, child_name, child in _children(base):
        if type(child).__name__ not in (names[1], "FusedSwiGLUMLP"):
            continue
        if any(lora_parts(getattr(child, p)) is None
               for p in ("gate_proj", "up_proj", "down_proj")):
            continue
        if not isinstance(child, FusedSwiGLUMLP):
            child = FusedSwiGLUMLP(child, use_liger=False)
            setattr(parent, child_name, child)
        child.fuse_lora = True
        child.backward_chunks = backward_chunks
        if pack and child.pack():
            child.defer_norm(parent)
        fused += 1
    if fused and pack:
        _refresh_before_each_pass(base)
    return fused


def _packed_mlps(model: torch.nn.Module) -> list[FusedSwiGLUMLP]:
    return [m for m in model.modules()
            if isinstance(m, FusedSwiGLUMLP) and m.packed_gate_up is not None]


def _refresh_before_each_pass(base: torch.nn.Module) -> None:
    """A forward pre-hook on the decoder (outside the compiled layers): every pass through
    the model sees the adapters' current B in the packed buffers."""
    decoder = base.get_decoder() if hasattr(base, "get_decoder") else base
    inside = {id(m) for m in _packed_mlps(decoder)}
    for mlp in _packed_mlps(base):
        if id(mlp) not in inside:  # no pass through the decoder refreshes it: stay unpacked
            mlp.unpack()
    # kept on the decoder (not in the hook's closure): a deep copy of the model refreshes
    # its own buffers
    decoder._tunesmith_packed_mlps = _packed_mlps(decoder)
    if getattr(decoder, "_tunesmith_refresh", None) is None:
        decoder._tunesmith_refresh = decoder.register_forward_pre_hook(_refresh_packed)


def _refresh_packed(decoder: torch.nn.Module, _args: Any) -> None:
    for mlp in decoder._tunesmith_packed_mlps:
        mlp.refresh()


def restore_mlps(model: torch.nn.Module) -> int:
    """Put the model's own MLP modules back in place of FusedSwiGLUMLP (with whatever
    projections they hold now); returns how many."""
    restored = 0
    for module in model.modules():
        handle = getattr(module, "_tunesmith_refresh", None)
        if handle is not None:
            handle.remove()
            module._tunesmith_refresh = None
            module._tunesmith_packed_mlps = []
    for parent, child_name, child in _children(model):
        if isinstance(child, FusedSwiGLUMLP):
            child.restore_norm()
            child.unpack()
            original = child.original[0]
            original.gate_proj, original.up_proj = child.gate_proj, child.up_proj
            original.down_proj = child.down_proj
            setattr(parent, child_name, original)
            restored += 1
    return restored
