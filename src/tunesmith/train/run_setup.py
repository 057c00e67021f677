"""LLaMA-Factory keys resolved into what the recipe hands to lower layers: load options,
the token-loss variant, the trainable parameters' dtype, checks and warnings."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from tunesmith.config.method_keys import MethodConfig
from tunesmith.config.schema import Config, TrainingConfig
from tunesmith.errors import ConfigError
from tunesmith.kernels.token_weights import TokenLoss
from tunesmith.models.load_options import LoadOptions
from tunesmith.models.vocab import add_vocab_tokens, read_token_descriptions, resize_embeddings
from tunesmith.train.anchored import AnchoredObjective, frozen_copy
from tunesmith.train.objective import NextTokenObjective

log = logging.getLogger(__name__)


def load_options(cfg: Config) -> LoadOptions:
    """Model and tokenizer loading; RoPE scaling reaches model_max_length, else cutoff_len
    (LLaMA-Factory's training default)."""
    r, q = cfg.run, cfg.method
    return LoadOptions(revision=r.model_revision, use_fast_tokenizer=r.use_fast_tokenizer,
                       low_cpu_mem_usage=r.low_cpu_mem_usage,
                       model_max_length=r.model_max_length or (cfg.data.cutoff_len
                                                               if r.rope_scaling else 0),
                       rope_scaling=r.rope_scaling, quantization_bit=q.quantization_bit,
                       quantization_type=q.quantization_type,
                       double_quantization=q.double_quantization)


def build_objective(cfg: Config, model: torch.nn.Module) -> NextTokenObjective:
    """Next-token loss with the configured variant; use_asft_loss adds the KL anchor to a
    frozen copy of `model` (call before training changes it)."""
    t = cfg.training
    spec = token_loss(cfg)
    if cfg.method.use_asft_loss:
        return AnchoredObjective(frozen_copy(model), cfg.method.asft_alpha, t.loss_impl,
                                 t.loss_chunk_size, spec.smoothing)
    return NextTokenObjective(t.loss_impl, t.loss_chunk_size, spec)


def token_loss(cfg: Config) -> TokenLoss:
    """The loss variant: use_dft_loss / use_eaft_loss / use_asft_loss (one at most), label
    smoothing."""
    m = cfg.method
    chosen = [k for k in ("use_dft_loss", "use_eaft_loss", "use_asft_loss") if getattr(m, k)]
    if len(chosen) > 1:
        raise ConfigError(f"{', '.join(chosen)}: choose one token-loss variant (use_asft_loss "
                          "includes the DFT weighting)")
    kind = "dft" if m.use_dft_loss else "eaft" if m.use_eaft_loss else "none"
    return TokenLoss(kind, m.eaft_alpha, cfg.run.label_smoothing_factor)


def master_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    """Trainable parameters' dtype: fp32, or bf16 with pure_bf16 on a GPU."""
    if cfg.method.pure_bf16 and device.type == "cuda":
        return torch.bfloat16
    if cfg.method.pure_bf16:
        log.warning("pure_bf16: this run is on %s; it trains in fp32 (bf16 applies on GPUs)",
                    device.type)
    return torch.float32


def check_run_keys(cfg: Config) -> None:
    """Values tunesmith cannot honour stop the run; inert LLaMA-Factory keys warn."""
    r = cfg.run
    if r.log_level != "passive" and logging.getLogger("tunesmith").level < logging.ERROR:
        logging.getLogger("tunesmith").setLevel(r.log_level.upper())  # rank 0 only
    if not r.save_safetensors:
        raise ConfigError("save_safetensors: false asks for pickle (.bin) weights, which "
                          "tunesmith never writes; remove the key")
    if cfg.ray.ray_num_workers != 1 and not cfg.ray.use_ray:
        log.warning("ray_num_workers: %d has no effect without use_ray (as in LLaMA-Factory); "
                    "tunesmith uses the GPUs it sees through torchrun", cfg.ray.ray_num_workers)
    if cfg.method.quantization_bit and cfg.finetuning.finetuning_type not in ("lora", "oft"):
        raise ConfigError(f"quantization_bit: a quantised base trains only adapters; set "
                          f"finetuning_type lora (got {cfg.finetuning.finetuning_type})")


def extend_vocab(tokenizer: Any, cfg: Config) -> dict[str, str]:
    """Add the configured tokens to the tokenizer (before the data is tokenised); returns
    the token descriptions of new_special_tokens_config."""
    v = cfg.vocab
    described = read_token_descriptions(v.new_special_tokens_config) \
        if v.new_special_tokens_config else {}
    add_vocab_tokens(tokenizer, v.add_tokens, [*v.add_special_tokens, *described])
    return described


def grow_embeddings(model: torch.nn.Module, tokenizer: Any, cfg: Config,
                    described: dict[str, str]) -> MethodConfig:
    """resize_vocab (on by itself when tokens were added): embeddings follow the tokenizer.
    Returns the method config, with embed and head trained and saved when LoRA/OFT."""
    v, method = cfg.vocab, cfg.method
    wants = v.resize_vocab or v.add_tokens or v.add_special_tokens or described
    if not wants or not resize_embeddings(model, tokenizer, v.init_special_tokens, described,
                                          cfg.training.seed):
        return method
    if cfg.finetuning.finetuning_type in ("lora", "oft") and not method.additional_target:
        names = [n.rsplit(".", 1)[-1] for n, m in model.named_modules()
                 if m is model.get_input_embeddings() or m is model.get_output_embeddings()]
        log.info("resize_vocab: training %s with the adapter", ", ".join(names))
        return dataclasses.replace(method, additional_target=names)
    return method


def check_wrap_class(model: torch.nn.Module, cfg: Config) -> None:
    """fsdp_transformer_layer_cls_to_wrap must name the decoder layer class tunesmith wraps."""
    wanted = cfg.run.fsdp_transformer_layer_cls_to_wrap
    if not wanted:
        return
    classes = {type(m).__name__ for m in model.modules() if type(m).__name__.endswith("Layer")}
    if wanted not in classes:
        raise ConfigError(f"fsdp_transformer_layer_cls_to_wrap: {wanted!r} is not a layer of "
                          f"this model ({', '.join(sorted(classes)) or 'none found'}); "
                          "tunesmith wraps each decoder layer, so the key may be removed")


def log_param_status(model: torch.nn.Module) -> None:
    """print_param_status: every parameter with its shape, dtype, device and trainability."""
    for name, p in model.named_parameters():
        log.info("param %s shape=%s dtype=%s device=%s trainable=%s", name, tuple(p.shape),
                 p.dtype, p.device, p.requires_grad)


def amp_dtype(cfg: TrainingConfig, device: torch.device) -> torch.dtype | None:
    if device.type != "cuda":
        if cfg.bf16 or cfg.fp16:
            log.info("bf16/fp16 apply on GPU only; this CPU run computes in fp32")
        return None
    if cfg.bf16:
        return torch.bfloat16
    if cfg.fp16:
        return torch.float16
    return None
