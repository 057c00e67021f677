"""Speed and memory settings applied to a loaded model through public extension points:
the attention registry, module swaps, activation checkpointing and regional compilation.

    gradient_checkpointing: false      keep every activation (fastest, most memory)
                            selective  keep matmul/attention outputs, recompute the cheap
                                       element-wise ops inside each decoder layer
                            true       keep only each decoder layer's input; recompute the rest
                            offload    as true, with those inputs parked in pinned CPU memory
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager, nullcontext
from functools import partial

import torch

from tunesmith.kernels.attention import register_varlen_attention
from tunesmith.kernels.fused import swap_fused_modules

log = logging.getLogger(__name__)

# Ops whose outputs selective checkpointing keeps (expensive to recompute).
_SAVE_OPS = {"mm", "addmm", "bmm", "_scaled_dot_product_flash_attention",
             "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
             "_scaled_dot_product_flash_attention_for_cpu",
             "_flash_attention_forward", "_efficient_attention_forward", "_varlen_attn",
             "linear"}


def _selective_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    name = getattr(op, "__name__", str(op)).split(".")[0]
    return (CheckpointPolicy.MUST_SAVE if name in _SAVE_OPS
            else CheckpointPolicy.PREFER_RECOMPUTE)


def enable_checkpointing(model: torch.nn.Module, mode: str) -> None:
    if mode == "false":
        return
    kwargs: dict = {"use_reentrant": False}
    if mode == "selective":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _selective_policy)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class ActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """Tensors saved for backward go to (pinned) CPU memory and come back for backward,
    like torch's `save_on_cpu`; `packed` / `unpacked` count them, so a test can see the
    hooks ran."""

    def __init__(self, pin_memory: bool):
        self.packed = self.unpacked = 0
        super().__init__(partial(self._pack, pin_memory), self._unpack)

    def _pack(self, pin_memory: bool, tensor: torch.Tensor) -> tuple[torch.device, torch.Tensor]:
        self.packed += 1
        if tensor.device.type == "cpu":
            return tensor.device, tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                           pin_memory=pin_memory)
        host.copy_(tensor)
        return tensor.device, host

    def _unpack(self, packed: tuple[torch.device, torch.Tensor]) -> torch.Tensor:
        self.unpacked += 1
        device, tensor = packed
        return tensor.to(device, non_blocking=True)


def activation_offload(mode: str, device: torch.device) -> AbstractContextManager:
    """Context for the forward pass: with `offload`, tensors saved for backward (the layer
    inputs kept by checkpointing) go to pinned CPU memory and come back for backward."""
    if mode == "offload":
        return ActivationOffload(pin_memory=device.type == "cuda")
    return nullcontext()


def use_varlen_attention(model: torch.nn.Module) -> None:
    name = register_varlen_attention()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if hasattr(base, "set_attn_implementation"):
        base.set_attn_implementation(name)
    else:  # older transformers
        base.config._attn_implementation = name


def compile_decoder_layers(model: torch.nn.Module) -> int:
    """Regional compilation: each decoder layer compiled in place (one graph shared by all
    identical layers), leaving the loss and the loop eager."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    layers = getattr(base.get_decoder(), "layers", None)
    if layers is None:
        log.warning("torch_compile: no decoder `layers` found; nothing compiled")
        return 0
    for layer in layers:
        layer.compile()
    return len(layers)


def apply_fused_kernels(model: torch.nn.Module, use_liger: bool) -> int:
    n = swap_fused_modules(model, use_liger)
    log.info("fused kernels: %d module(s) swapped (%s)", n,
             "liger-kernel on GPU tensors" if use_liger else "reference ops")
    return n
