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
from collections import Counter
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch

from tunesmith.errors import ConfigError
from tunesmith.kernels.attention import VARLEN_ATTENTION, register_varlen_attention
from tunesmith.kernels.fused import fuse_lora_mlps, swap_fused_modules

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


def enable_checkpointing(model: torch.nn.Module, mode: str, *, reentrant: bool = False,
                         stats: Any = None) -> int:
    """Checkpoint every decoder layer; returns how many. `stats.layer_runs` counts eager runs
    of the checkpointed layer bodies (forward + recompute), the proof that recompute ran."""
    if mode == "false":
        return 0
    if mode == "selective" and reentrant:
        raise ConfigError("gradient_checkpointing: selective needs use_reentrant_gc: false")
    kwargs: dict = {"use_reentrant": reentrant}
    if mode == "selective":
        from torch.utils.checkpoint import create_selective_checkpoint_contexts

        kwargs["context_fn"] = partial(create_selective_checkpoint_contexts, _selective_policy)
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not getattr(base, "supports_gradient_checkpointing", False):
        raise ConfigError(f"gradient_checkpointing: {mode}: {type(base).__name__} does not "
                          "support activation checkpointing; set gradient_checkpointing: false")
    if reentrant:  # reentrant recompute gives gradients only when its inputs require them
        base.enable_input_require_grads()
    base._set_gradient_checkpointing(enable=True,
                                     gradient_checkpointing_func=_checkpoint_func(kwargs, stats))
    return sum(1 for layer in decoder_layers(base) if getattr(layer, "gradient_checkpointing",
                                                              False))


def _checkpoint_func(kwargs: dict, stats: Any):
    from torch.utils.checkpoint import checkpoint

    def run(function, *args, **kw):
        def counted(*a, **k):
            if stats is not None and not torch.compiler.is_compiling():
                stats.layer_runs += 1
            return function(*a, **k)

        return checkpoint(counted, *args, **kwargs, **kw)

    return run


# Bytes of saved activations parked in CPU memory by `activation_offload` (process-wide,
# like the hooks; the run summary reports them as proof that offload happened).
OFFLOAD_COUNTS: Counter[str] = Counter()


class ActivationOffload(torch.autograd.graph.saved_tensors_hooks):
    """Tensors saved for backward go to (pinned) CPU memory and come back for backward,
    like torch's `save_on_cpu`; `packed` / `unpacked` count them, so a test can see the
    hooks ran.

    On a GPU the copy out runs on a side stream without blocking the host (the tensor's
    memory is held until the copy ends: record_stream), and the copy back waits for it on the
    device (an event), not on the host: the forward pass never stops for a copy."""

    def __init__(self, pin_memory: bool):
        self.packed = self.unpacked = self.async_copies = self.device_packed = 0
        self.pin_memory = pin_memory
        self._side: torch.cuda.Stream | None = None
        super().__init__(partial(self._pack, pin_memory), self._unpack)

    def _pack(self, pin_memory: bool, tensor: torch.Tensor) -> tuple:
        self.packed += 1
        if not torch.compiler.is_compiling():  # the run summary's offloaded_mb
            OFFLOAD_COUNTS["bytes"] += tensor.numel() * tensor.element_size()
        if tensor.device.type == "cpu":
            return tensor.device, tensor, None
        self.device_packed += 1
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                           pin_memory=pin_memory)
        if not (pin_memory and tensor.is_cuda) or torch.compiler.is_compiling():
            host.copy_(tensor)
            return tensor.device, host, None
        if self._side is None:
            self._side = torch.cuda.Stream(tensor.device)
        self._side.wait_stream(torch.cuda.current_stream(tensor.device))
        with torch.cuda.stream(self._side):
            host.copy_(tensor, non_blocking=True)
        tensor.record_stream(self._side)  # its memory is not reused before the copy ends
        done = torch.cuda.Event()
        done.record(self._side)
        self.async_copies += 1
        return tensor.device, host, done

    def _unpack(self, packed: tuple) -> torch.Tensor:
        self.unpacked += 1
        device, tensor, done = packed
        if done is not None:
            torch.cuda.current_stream(device).wait_event(done)
        return tensor.to(device, non_blocking=self.pin_memory)


def activation_offload(mode: str, device: torch.device) -> AbstractContextManager:
    """Context for the forward pass: with `offload`, tensors saved for backward (the layer
    inputs kept by checkpointing) go to pinned CPU memory and come back for backward."""
    if mode == "offload":
        return ActivationOffload(pin_memory=device.type == "cuda")
    return nullcontext()


def set_attention(model: torch.nn.Module, name: str) -> None:
    """Switch a loaded model's attention implementation (registering tunesmith's own)."""
    if name in ("varlen", VARLEN_ATTENTION):
        name = register_varlen_attention()
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    language = getattr(getattr(base, "model", None), "language_model", None)
    if language is not None and is_vision_language(base):
        # vision-language: the (causal, packed) language model only; the vision tower keeps
        # its own bidirectional attention
        base = language
    if getattr(base.config, "_attn_implementation", None) == name:
        return
    if hasattr(base, "set_attn_implementation"):
        base.set_attn_implementation(name)
    else:  # older transformers
        base.config._attn_implementation = name


def is_vision_language(model: torch.nn.Module) -> bool:
    """A vision-language model (a vision tower beside its language model)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return hasattr(getattr(base, "model", None), "visual")


def use_varlen_attention(model: torch.nn.Module) -> None:
    set_attention(model, VARLEN_ATTENTION)


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return list(getattr(base.get_decoder(), "layers", None) or [])


def compile_decoder_layers(model: torch.nn.Module, backend: str = "inductor",
                           hooks_outside: bool = False) -> int:
    """Regional compilation: each decoder layer compiled in place (one graph shared by all
    identical layers), leaving the loss and the loop eager. Compilation itself happens at
    the first forward pass. `hooks_outside`: compile only the layer's forward, so module
    hooks (DeepSpeed ZeRO-3 gathers a layer's weights in one) run eagerly around the graph
    instead of breaking it."""
    layers = decoder_layers(model)
    if not layers:
        log.warning("torch_compile: no decoder `layers` found; nothing compiled")
        return 0
    for layer in layers:
        if hooks_outside:
            layer.forward = torch.compile(layer.forward, backend=backend)
        else:
            layer.compile(backend=backend)
    return len(layers)


def uncompile_decoder_layers(model: torch.nn.Module) -> None:
    """Undo `compile_decoder_layers`: the layers run eagerly again. nn.Module.compile keeps
    its compiled call in `_compiled_call_impl`; torch has no public inverse."""
    for layer in decoder_layers(model):
        layer._compiled_call_impl = None
        layer.__dict__.pop("forward", None)  # the hooks_outside form: the class's forward


def upcast_norm_weights(model: torch.nn.Module) -> int:
    """Norm weights (1-D parameters of modules named *norm*) in fp32; returns how many were
    cast (0 when they already are)."""
    n = 0
    for name, module in model.named_modules():
        if "norm" not in name.rsplit(".", 1)[-1].lower():
            continue
        for param in module.parameters(recurse=False):
            if param.ndim == 1 and param.dtype != torch.float32:
                param.data = param.data.float()
                n += 1
    return n


def keep_lora_inputs_in_compute_dtype(model: torch.nn.Module) -> int:
    """PEFT casts each LoRA layer's input to the adapter weights' dtype (fp32) before the
    rank-r product; under bf16/fp16 autocast that product casts it straight back, and backward
    keeps the round-tripped copy: one more [tokens, hidden] tensor per adapted input (1.6 GB
    at 8,192 tokens of Qwen2.5-7B, compiled). Only for models that run every pass under
    autocast (the trainer's): without it the bf16 input would meet fp32 weights. Returns how
    many LoRA layers changed."""
    n = 0
    for module in model.modules():
        if getattr(module, "cast_input_dtype_enabled", False) and hasattr(module, "lora_A"):
            module.cast_input_dtype_enabled = False
            n += 1
    return n


def set_tf32(enabled: bool, device: torch.device) -> None:
    if not enabled:
        return
    if device.type != "cuda":
        log.warning("tf32: true applies to NVIDIA GPUs; this %s run is unaffected", device.type)
        return
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True


def apply_fused_kernels(model: torch.nn.Module, use_liger: bool) -> int:
    n = swap_fused_modules(model, use_liger)
    log.info("fused kernels: %d module(s) swapped (%s)", n,
             "liger-kernel on GPU tensors" if use_liger else "reference ops")
    return n


# Token blocks of the fused MLP's backward when layers are recomputed: the memory-first
# modes, where its [tokens, I] temporaries are the largest thing a layer's backward holds.
RECOMPUTE_MLP_CHUNKS = 4


def apply_fused_lora_mlp(model: torch.nn.Module, mode: str, finetuning_type: str,
                         sharded_by: str, checkpointing: str = "false") -> tuple[int, str]:
    """`fused_lora_mlp`: (MLPs switched to the fused LoRA function, the reason). `sharded_by`
    names DeepSpeed/FSDP when they hold the weights: their per-module gathering would not see
    the fused function's direct use of the weights, so the modules' own forward stays. With
    whole-layer recompute (`true`, `offload`) their backward runs in token blocks."""
    if mode == "false":
        return 0, "fused_lora_mlp: false"
    blocker = ("finetuning_type is not lora" if finetuning_type != "lora" else
               f"{sharded_by} gathers weights per module" if sharded_by else "")
    chunks = RECOMPUTE_MLP_CHUNKS if checkpointing in ("true", "offload") else 1
    n = 0 if blocker else fuse_lora_mlps(model, backward_chunks=chunks)
    if n == 0 and not blocker:
        blocker = ("no SwiGLU MLP with plain LoRA on gate_proj, up_proj and down_proj (they "
                   "need lora_target to include all three, lora_dropout 0, no DoRA, an "
                   "unquantised base, and a llama/mistral/qwen-family model)")
    if mode == "true" and blocker:
        raise ConfigError(f"fused_lora_mlp: true cannot be applied: {blocker}; set "
                          "fused_lora_mlp: auto or false")
    reason = (f"{n} MLP(s) fused" + (f", backward in {chunks} token blocks" if chunks > 1
                                      else "")) if n else f"off: {blocker}"
    log.info("fused_lora_mlp: %s", reason)
    return n, reason
