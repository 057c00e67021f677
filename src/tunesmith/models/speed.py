"""One speed plan per run: which attention kernel, recompute mode and compilation the keys
and the hardware give, each with the reason, and what actually ran (`LeverStats`).

    padding_free: auto -> on              unpacked text sft/pt batches where varlen
                                          FlashAttention runs: each micro-batch becomes
                                          one row of its samples back to back
    attn_implementation: auto -> varlen   CUDA GPU, packed (or padding-free) batches,
                                          bf16/fp16, torch's varlen FlashAttention present
                               -> sdpa    otherwise (its fused kernels on CUDA)
    torch_compile: auto -> on             CUDA training of an architecture in
                                          COMPILE_CLEAN_MODEL_TYPES (under DeepSpeed
                                          only the layers' forward, hooks outside; not
                                          where ZeRO-3 hooks inside the layers)
                        -> off            otherwise (CPU runs stay eager)
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from tunesmith.config.schema import Config
from tunesmith.config.speed import (
    FLASH_TO_ATTENTION,
    padding_free_stage_blocker,
    zero3_layers_whole,
)
from tunesmith.errors import ConfigError
from tunesmith.kernels.attention import VARLEN_ATTENTION, varlen_kernel_available

log = logging.getLogger(__name__)

# Architectures whose decoder layers compile without graph breaks on transformers 5 (checked
# on the H200 suite); others compile only when asked for (torch_compile: true).
COMPILE_CLEAN_MODEL_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral", "gemma", "gemma2",
                                       "gemma3_text", "phi3", "olmo2", "granite"})


@dataclass
class LeverStats:
    """What the levers did at run time (proof, not intent)."""

    checkpointed_layers: int = 0
    layer_runs: int = 0  # eager runs of checkpointed layer bodies: forward + recompute
    compiled_layers: int = 0
    compile_fallback: str = ""  # the error that turned compilation off, if any
    compiled_graphs: int = 0  # graphs torch.compile built during the run
    upcast_params: int = 0
    fused_lora_mlps: int = 0  # MLPs running the fused LoRA function (kernels/lora_mlp.py)
    fused_lora_mlp_reason: str = ""
    lora_inputs_uncast: int = 0  # LoRA layers whose input skips PEFT's fp32 round trip
    input_embedding: str = ""  # where the input embedding table lives, and why


@dataclass
class SpeedPlan:
    attention: str  # the attn_implementation given to transformers
    attention_reason: str
    checkpointing: str  # false | true | selective | offload
    reentrant: bool
    compile: bool = False
    compile_reason: str = ""
    compile_backend: str = "inductor"
    tf32: bool = False
    upcast_layernorm: bool = False
    padding_free: bool = False  # unpacked micro-batches collated as one row each
    padding_free_reason: str = ""
    stats: LeverStats = field(default_factory=LeverStats)
    host_embedding = None  # models.host_embedding's module (not a field: asdict copies)

    def report(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("stats")
        host = self.host_embedding
        out["embedding_staged"] = host.staged_hits if host is not None else 0
        out["embedding_host_reads"] = host.host_reads if host is not None else 0
        return {**out, **asdict(self.stats)}


def plan_attention(cfg: Config, device: torch.device, vision: bool = False) -> SpeedPlan:
    """The part of the plan needed before the model is loaded."""
    flat, flat_reason = resolve_padding_free(cfg, device, vision)
    name, reason = resolve_attention(cfg, device, flat)
    return SpeedPlan(attention=name, attention_reason=reason,
                     padding_free=flat, padding_free_reason=flat_reason,
                     checkpointing=cfg.training.gradient_checkpointing,
                     reentrant=cfg.speed.use_reentrant_gc, tf32=cfg.speed.tf32,
                     upcast_layernorm=cfg.speed.upcast_layernorm,
                     compile_backend=cfg.speed.torch_compile_backend)


def _requested_attention(cfg: Config) -> str:
    requested = cfg.model.attn_implementation
    flash = FLASH_TO_ATTENTION.get(cfg.speed.flash_attn)
    return flash if requested == "auto" and flash else requested


def resolve_padding_free(cfg: Config, device: torch.device, vision: bool = False
                         ) -> tuple[bool, str]:
    """Whether unpacked micro-batches are collated as one row of their samples (varlen
    attention keeps them apart), and why."""
    mode = cfg.speed.padding_free
    if cfg.data.packing or cfg.data.neat_packing:
        return False, "packing: the rows are packed (padding-free) already"
    if mode == "false":
        return False, "padding_free: false"
    blocker = padding_free_stage_blocker(cfg.finetuning.stage) or (
        "vision-language model" if vision else "")
    if blocker and mode == "true":
        raise ConfigError(f"padding_free: true cannot be applied: {blocker}; set padding_free: "
                          "auto or false")
    if blocker:
        return False, f"auto: {blocker}"
    if mode == "true":
        return True, "padding_free: true"
    requested = _requested_attention(cfg)
    if requested not in ("auto", "varlen", VARLEN_ATTENTION, "flash"):
        return False, f"auto: attn_implementation {requested} runs padded rows"
    half = device.type == "cuda" and (cfg.training.bf16 or cfg.training.fp16)
    if not (half and varlen_kernel_available()):
        return False, ("auto: needs torch's varlen FlashAttention on a CUDA GPU in bf16/fp16; "
                       "padding_free: true flattens anyway")
    return True, ("auto: unpacked batches on a CUDA GPU in bf16/fp16, each micro-batch one row "
                  "of its samples (varlen FlashAttention)")


def resolve_attention(cfg: Config, device: torch.device, padding_free: bool = False
                      ) -> tuple[str, str]:
    requested = _requested_attention(cfg)
    packed = cfg.data.packing or cfg.data.neat_packing or padding_free
    half = device.type == "cuda" and (cfg.training.bf16 or cfg.training.fp16)
    if requested == "flash":  # flash_attn: fa2 | fa3
        if device.type != "cuda":
            log.warning("flash_attn: %s: no flash kernel on %s; using %s (the same math)",
                        cfg.speed.flash_attn, device.type,
                        "the varlen reference twin" if packed else "sdpa")
        if packed:
            return VARLEN_ATTENTION, f"flash_attn: {cfg.speed.flash_attn} with packed batches"
        # on torch 2.11 with an H200, SDPA runs cuDNN's fused kernel here (its own choice)
        return "sdpa", (f"flash_attn: {cfg.speed.flash_attn} without packing: SDPA's fused "
                        "kernels (torch picks cuDNN's or FlashAttention's)")
    if requested == "auto":
        if packed and half and varlen_kernel_available():
            return VARLEN_ATTENTION, (f"auto: {'padding-free' if padding_free else 'packed'} "
                                      "batches on a CUDA GPU in bf16/fp16")
        why = ("CPU run" if device.type != "cuda" else "batches not packed" if not packed
               else "no bf16/fp16" if not half else "torch has no varlen FlashAttention")
        return "sdpa", f"auto: {why}"
    if requested in ("varlen", VARLEN_ATTENTION):
        return VARLEN_ATTENTION, "attn_implementation: varlen"
    return requested, f"attn_implementation: {requested}"


def plan_compile(plan: SpeedPlan, cfg: Config, device: torch.device, model_type: str) -> None:
    """Fill in the compile decision once the architecture is known."""
    mode = str(cfg.model.torch_compile).lower()
    selective_gpu = device.type == "cuda" and cfg.training.gradient_checkpointing == "selective"
    if mode == "true" and selective_gpu:
        # inductor's in-place kernels mutate tensors that selective recompute keeps: the
        # backward fails ("Tensor cached during selective activation checkpoint has been
        # mutated"; torch 2.11 on an H200), so these layers run eager
        plan.compile, plan.compile_reason = False, (
            "torch_compile: true, but selective recompute runs eager on a GPU (inductor "
            "mutates the tensors it keeps); use gradient_checkpointing: true to compile")
        log.warning("%s", plan.compile_reason)
        return
    if mode in ("true", "false"):
        plan.compile, plan.compile_reason = mode == "true", f"torch_compile: {mode}"
        return
    if device.type != "cuda":
        plan.compile, plan.compile_reason = False, "auto: CPU runs stay eager"
    elif selective_gpu:
        plan.compile, plan.compile_reason = False, (
            "auto: selective recompute runs eager on a GPU (inductor mutates the tensors it "
            "keeps)")
    elif cfg.training.deepspeed and zero3_layers_whole(cfg.training.deepspeed) is False:
        plan.compile, plan.compile_reason = False, (
            "auto: the DeepSpeed JSON sets stage3_module_granularity_threshold, so ZeRO-3 "
            "hooks modules inside the layers, which would break each compiled layer into "
            "pieces; torch_compile: true compiles anyway")
    elif model_type not in COMPILE_CLEAN_MODEL_TYPES:
        plan.compile, plan.compile_reason = False, (
            f"auto: {model_type!r} is not on the list of architectures known to compile "
            "cleanly; torch_compile: true compiles it anyway")
    else:
        plan.compile, plan.compile_reason = True, f"auto: CUDA training of {model_type}"


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far (dynamo's own counter)."""
    try:
        from torch._dynamo.utils import counters
    except ImportError:  # pragma: no cover
        return 0
    return int(counters["stats"]["unique_graphs"])


def check_compile_backend(backend: str) -> None:
    from torch._dynamo import list_backends

    known = list_backends(exclude_tags=())
    if backend not in known:
        raise ConfigError(f"torch_compile_backend: {backend!r} is not a torch.compile backend; "
                          f"choose one of {', '.join(sorted(known))}")


def is_compile_failure(exc: BaseException) -> bool:
    """True for errors raised by torch.compile's tracing or code generation."""
    kinds: list[type] = []
    try:
        from torch._dynamo.exc import TorchDynamoException

        kinds.append(TorchDynamoException)
    except ImportError:  # pragma: no cover - very old torch
        pass
    try:
        from torch._inductor.exc import InductorError

        kinds.append(InductorError)
    except ImportError:  # pragma: no cover - torch without it
        pass
    return bool(kinds) and isinstance(exc, tuple(kinds))


class CompileGuard:
    """Turns a compile failure at the first steps into an eager run with one warning."""

    def __init__(self, model: torch.nn.Module, plan: SpeedPlan):
        self.model, self.plan = model, plan

    def recover(self, exc: BaseException) -> bool:
        """True when `exc` was a compile failure and the layers now run eagerly (the caller
        retries the step); False when the caller must raise it."""
        if not self.plan.compile or self.plan.stats.compile_fallback:
            return False
        if not is_compile_failure(exc):
            return False
        from tunesmith.models.acceleration import uncompile_decoder_layers

        uncompile_decoder_layers(self.model)
        self.plan.stats.compile_fallback = _describe(exc)
        self.plan.stats.compiled_layers = 0
        log.warning("torch_compile: compiling the decoder layers failed (%s); continuing "
                    "eagerly. Set torch_compile: false to skip the attempt.",
                    self.plan.stats.compile_fallback)
        return True


def _describe(exc: BaseException) -> str:
    """One line naming the error and its root cause (dynamo wraps the backend's error)."""
    first = (str(exc).strip().splitlines() or [""])[0]
    text = f"{type(exc).__name__}: {first}"
    cause = getattr(exc, "inner_exception", None) or exc.__cause__
    if cause is not None:
        text += f" <- {type(cause).__name__}: {str(cause).strip()[:200]}"
    return text[:500]
