"""LLaMA-Factory's speed keys, with LLaMA-Factory's meaning.

They are alternative spellings of tunesmith's own levers (`attn_implementation`,
`gradient_checkpointing`, `torch_compile`); `speed_conflicts` refuses combinations that
say two different things, and `models/speed.py` resolves them into one plan.

    flash_attn: auto | disabled | sdpa | fa2 | fa3
        disabled -> eager; sdpa -> sdpa; fa2/fa3 -> the fastest flash kernel available
        (torch's varlen FlashAttention for packed batches, SDPA's fused kernels otherwise,
        where torch picks cuDNN's or FlashAttention's; no flash-attn package needed)
    disable_gradient_checkpointing: true -> no recompute; false (LLaMA-Factory's default,
        written out) -> recompute every decoder layer
    use_unsloth_gc: recompute with the saved layer inputs parked in CPU memory (offload)
    gradient_checkpointing_kwargs: transformers' keyword arguments of torch's checkpoint;
        use_reentrant is honoured (it sets use_reentrant_gc), any other key is refused
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tunesmith.config.fields import opt

if TYPE_CHECKING:
    from tunesmith.config.schema import Config

FlashAttn = Literal["auto", "disabled", "sdpa", "fa2", "fa3"]
TriState = Literal["", "true", "false"]

FLASH_TO_ATTENTION = {"disabled": "eager", "sdpa": "sdpa", "fa2": "flash", "fa3": "flash"}


@dataclass
class SpeedConfig:
    flash_attn: FlashAttn = opt(
        "auto", "LLaMA-Factory's attention switch: auto (attn_implementation decides), "
        "disabled (eager), sdpa, fa2 or fa3 (the fastest flash kernel available: varlen "
        "FlashAttention for packed batches, SDPA's fused kernels otherwise: torch picks "
        "cuDNN's or FlashAttention's).", advanced=True)
    disable_gradient_checkpointing: TriState = opt(
        "", "LLaMA-Factory key: true turns recompute off; false (LLaMA-Factory's default, "
        "when written out) recomputes every decoder layer. Unset: gradient_checkpointing "
        "decides (tunesmith's default is no recompute).", advanced=True)
    use_unsloth_gc: bool = opt(
        False, "LLaMA-Factory key: offloaded checkpointing (same as gradient_checkpointing: "
        "offload).", advanced=True)
    use_reentrant_gc: bool = opt(
        False, "Reentrant activation checkpointing (LLaMA-Factory's default is true; tunesmith's "
        "is false, which works with selective recompute and compilation; results are the "
        "same).", advanced=True)
    gradient_checkpointing_kwargs: dict = opt(
        {}, "transformers' key: keyword arguments of torch's activation checkpointing. "
        "tunesmith honours use_reentrant (the same as use_reentrant_gc) and refuses any "
        "other.", advanced=True)
    upcast_layernorm: bool = opt(
        False, "Keep the norm weights in fp32 when the base model is loaded in bf16/fp16.",
        advanced=True)
    upcast_lmhead_output: bool = opt(
        False, "Compute the output head's logits in fp32. tunesmith's fused loss always does, "
        "so true and false train the same.", advanced=True)
    tf32: bool = opt(
        False, "Allow TF32 tensor cores for fp32 matrix products and convolutions (NVIDIA "
        "Ampere or newer; no effect on CPU).", advanced=True)
    fused_lora_mlp: Literal["auto", "true", "false"] = opt(
        "auto", "Run each SwiGLU MLP whose gate/up/down projections carry plain LoRA as one "
        "fused function that keeps only its inputs and the gate/up outputs for backward "
        "(recomputing silu(gate) * up), about 38 KB less per token per layer for a 7B model; "
        "same results. auto: on for LoRA runs without DeepSpeed or FSDP; true: on, or an error "
        "saying why it cannot be; false: off.", advanced=True)
    padding_free: Literal["auto", "true", "false"] = opt(
        "auto", "Unpacked micro-batches run as one row holding their samples back to back "
        "(positions restart per sample, varlen attention keeps samples apart) instead of "
        "rows padded to the longest: the same samples per step and the same loss, no compute "
        "on padding. auto: on where torch's varlen FlashAttention runs (CUDA GPU, bf16/fp16, "
        "text sft/pt); true: on (CPU runs use the varlen reference twin), or an error saying "
        "why it cannot be; false: padded rows. Packed runs are padding-free already.",
        advanced=True)
    torch_compile_backend: str = opt(
        "inductor", "torch.compile backend for torch_compile (inductor; aot_eager and eager "
        "for debugging).", advanced=True)


def speed_conflicts(cfg: Config) -> list[tuple[str, str]]:
    """(key, message) for speed keys that contradict each other."""
    m, s, t = cfg.model, cfg.speed, cfg.training
    out: list[tuple[str, str]] = []
    wanted = FLASH_TO_ATTENTION.get(s.flash_attn)
    if wanted and m.attn_implementation not in ("auto", wanted):
        if not (wanted == "flash" and m.attn_implementation == "varlen"):
            out.append(("flash_attn", f"flash_attn: {s.flash_attn} contradicts "
                        f"attn_implementation: {m.attn_implementation}; keep one of them"))
    gc = t.gradient_checkpointing
    if s.disable_gradient_checkpointing == "true" and (gc != "false" or s.use_unsloth_gc):
        other = "use_unsloth_gc: true" if s.use_unsloth_gc else f"gradient_checkpointing: {gc}"
        out.append(("disable_gradient_checkpointing", "disable_gradient_checkpointing: true "
                    f"contradicts {other}; remove one of them"))
    if s.use_unsloth_gc and gc == "selective":
        out.append(("use_unsloth_gc", "use_unsloth_gc: true (offloaded checkpointing) "
                    "contradicts gradient_checkpointing: selective; keep one of them"))
    out += _checkpointing_kwargs_problems(s)
    stage_blocker = padding_free_stage_blocker(cfg.finetuning.stage)
    if s.padding_free == "true" and stage_blocker:
        out.append(("padding_free", f"padding_free: true cannot be applied: {stage_blocker}; "
                    "set padding_free: auto or false"))
    if reentrant(s) and gc == "selective":
        key = ("gradient_checkpointing_kwargs" if "use_reentrant" in s.gradient_checkpointing_kwargs
               else "use_reentrant_gc")
        out.append((key, f"{key}: reentrant checkpointing cannot run selective recompute (it "
                    "needs non-reentrant checkpointing); set use_reentrant to false"))
    return out


PADDING_FREE_STAGES = ("sft", "pt")


def padding_free_stage_blocker(stage: str) -> str:
    """Why a stage's batches cannot be flattened ("" for sft and pt)."""
    if stage in PADDING_FREE_STAGES:
        return ""
    return (f"stage {stage} batches pairs or rollouts (only "
            f"{' and '.join(PADDING_FREE_STAGES)} batches are flattened)")


def reentrant(s: SpeedConfig) -> bool:
    """use_reentrant_gc, or gradient_checkpointing_kwargs' use_reentrant when given."""
    return bool(s.gradient_checkpointing_kwargs.get("use_reentrant", s.use_reentrant_gc))


def _checkpointing_kwargs_problems(s: SpeedConfig) -> list[tuple[str, str]]:
    key, given = "gradient_checkpointing_kwargs", s.gradient_checkpointing_kwargs
    other = sorted(set(given) - {"use_reentrant"})
    if other:
        return [(key, f"{key}: {', '.join(map(str, other))} not honoured by tunesmith (it "
                 "runs torch's checkpoint with its own defaults and takes only use_reentrant "
                 "from here); remove them")]
    if "use_reentrant" not in given:
        return []
    value = given["use_reentrant"]
    if not isinstance(value, bool):
        return [(key, f"{key}: use_reentrant must be true or false, got {value!r}")]
    if s.use_reentrant_gc and not value:
        return [(key, f"{key}: use_reentrant: false contradicts use_reentrant_gc: true; "
                 "keep one of them")]
    return []


def checkpointing_mode(cfg: Config) -> str:
    """The recompute mode the keys ask for: false | true | selective | offload."""
    s, gc = cfg.speed, cfg.training.gradient_checkpointing
    if s.disable_gradient_checkpointing == "true":
        return "false"
    if s.use_unsloth_gc:
        return "offload"
    if s.disable_gradient_checkpointing == "false" and gc == "false":
        return "true"
    return gc


def resolve_speed_aliases(cfg: Config) -> None:
    """Write the recompute mode the LLaMA-Factory keys ask for into gradient_checkpointing,
    so every later reader (the loop, hints, the summary, config.resolved.yaml) sees it."""
    cfg.training.gradient_checkpointing = checkpointing_mode(cfg)
    cfg.speed.use_reentrant_gc = reentrant(cfg.speed)


def zero3_layers_whole_in(zero: dict) -> bool:
    """Whether ZeRO-3 takes whole decoder layers as its unit, given the JSON's
    zero_optimization section: unless it sets stage3_module_granularity_threshold, which
    hands the grouping to DeepSpeed (distributed/deepspeed.mark_layer_fetch_units)."""
    return "stage3_module_granularity_threshold" not in zero


def zero3_layers_whole(deepspeed: str) -> bool | None:
    """zero3_layers_whole_in for the JSON at `deepspeed`, before the model exists; None
    when it is not ZeRO-3 (no module hooks at all) or cannot be read (load_ds_config says
    why later)."""
    try:
        zero = json.loads(Path(deepspeed).read_text(encoding="utf-8")).get(
            "zero_optimization", {})
        if int(zero.get("stage", 0)) != 3:
            return None
    except (OSError, ValueError, TypeError, AttributeError):
        return None
    return zero3_layers_whole_in(zero)
