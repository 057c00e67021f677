"""`tunesmith train`: config -> data -> model (+adapters) -> loop -> outputs.

Read top to bottom; every step is a call into a lower layer.
"""

from __future__ import annotations

import json
import logging
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import torch

from tunesmith import __version__
from tunesmith.adapters.setup import prepare_trainable
from tunesmith.config.loader import dump_config
from tunesmith.config.schema import Config
from tunesmith.data.loader import LoaderOptions
from tunesmith.data.loading import DataContext, apply_packing, prepare_data
from tunesmith.data.template import ChatRenderer, load_template_source
from tunesmith.distributed.context import DistContext, barrier, broadcast_object, init_distributed
from tunesmith.distributed.handoff import prepare_on_main
from tunesmith.distributed.strategy import build_strategy, fsdp_settings
from tunesmith.errors import ConfigError, TunesmithError
from tunesmith.kernels.fused import liger_ops
from tunesmith.models.acceleration import (
    apply_fused_kernels,
    compile_decoder_layers,
    enable_checkpointing,
    use_varlen_attention,
)
from tunesmith.models.flops import batch_flops, build_flop_model
from tunesmith.models.loader import load_causal_lm, load_tokenizer
from tunesmith.models.provision import resolve_model_path
from tunesmith.recipes.stage import StageBuilder, StageParts
from tunesmith.runs.folder import LOSS_PLOT_FILE, METRICS_FILE, OUTPUT_ARTIFACTS, list_checkpoints
from tunesmith.train.loop import Trainer
from tunesmith.train.metrics import MetricsLog, plot_loss
from tunesmith.train.summary import write_summary

log = logging.getLogger(__name__)

def check_output_dir(cfg: Config) -> Path:
    t = cfg.training
    if not t.output_dir:
        raise ConfigError("output_dir: not set; give a folder for the tuned model, e.g. "
                          "output_dir: saves/my-run")
    out = Path(t.output_dir)
    if out.exists() and any(out.iterdir()):
        if t.resume_from_checkpoint:
            return out
        if not t.overwrite_output_dir:
            raise ConfigError(f"output_dir: {str(out)!r} exists and is not empty; set "
                              "overwrite_output_dir: true to replace it, or "
                              "resume_from_checkpoint: auto to continue it")
        for ckpt in list_checkpoints(out) + list(out.glob(".checkpoint-*")):
            shutil.rmtree(ckpt, ignore_errors=True)
        for name in OUTPUT_ARTIFACTS:
            (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


def check_output_dir_once(cfg: Config, ctx: DistContext) -> Path:
    """Rank 0 checks (and, with overwrite_output_dir, cleans) output_dir; every rank gets
    the same verdict."""
    problem = None
    if ctx.is_main:
        try:
            check_output_dir(cfg)
        except TunesmithError as exc:
            problem = exc
    message = broadcast_object(str(problem) if problem else None, ctx)
    if problem is not None:
        raise problem
    if message is not None:  # the same verdict on the other ranks
        raise TunesmithError(str(message))
    return Path(cfg.training.output_dir)


def sft_stage(cfg: Config, model: torch.nn.Module, device: torch.device,
              pad_id: int) -> StageParts:
    """Stages sft and pt: next-token cross-entropy."""
    from tunesmith.train.objective import NextTokenObjective

    return StageParts(NextTokenObjective(cfg.training.loss_impl, cfg.training.loss_chunk_size))


def run_sft(cfg: Config, build_stage: StageBuilder = sft_stage) -> dict[str, Any]:
    """Train any stage: `build_stage` gives its objective (sft_stage, preference_stage)."""
    m, f, t = cfg.model, cfg.finetuning, cfg.training
    if not m.model_name_or_path:
        raise ConfigError("model_name_or_path: not set; e.g. smollm2-135m-instruct")
    offload = bool(t.fsdp) and fsdp_settings(t).cpu_offload
    ctx = init_distributed(t.device, t.ddp_backend, t.ddp_timeout, cpu_offload=offload)
    out = check_output_dir_once(cfg, ctx)
    device = ctx.device
    model_path = resolve_model_path(m.model_name_or_path, m.cache_dir or None)
    tokenizer = load_tokenizer(model_path, trust_remote_code=m.trust_remote_code)
    template_name, template_source = load_template_source(m.template, tokenizer)
    renderer = ChatRenderer(template_name, template_source, tokenizer)
    data = prepare_on_main(
        lambda: prepare_data(cfg.data, DataContext(renderer, tokenizer, t.seed, f.stage,
                                                   t.overwrite_cache)),
        out / ".cache", "prepared-data", ctx, t.ddp_timeout)
    if ctx.is_main:
        dump_config(cfg, out / "config.resolved.yaml")

    model = build_model(cfg, model_path, device)  # same seed on every rank: same LoRA init
    stage = build_stage(cfg, model, device, tokenizer.pad_token_id)
    if stage.prepare is not None:
        stage.prepare(data)
    train_items = apply_packing(data, cfg.data)
    flop_model = build_flop_model(model, full=f.finetuning_type == "full")
    save_artifacts = partial(_save_model, model=model, tokenizer=tokenizer,
                             template_source=template_source, cfg=cfg,
                             save_extra=stage.save_extra)
    metrics = MetricsLog(out / METRICS_FILE, t.report_to, out) if ctx.is_main else None
    lora = f.finetuning_type == "lora"
    d = cfg.data
    loader = LoaderOptions(d.batch_tokens, d.dataloader_num_workers, d.dataloader_pin_memory,
                           d.dataloader_prefetch_factor, d.dataloader_persistent_workers)
    trainer = Trainer(model, stage.objective, train_items,
                      data.val, t, pad_id=tokenizer.pad_token_id, device=device,
                      output_dir=out, metrics=metrics,
                      checkpoint_extra=save_artifacts if lora else None,
                      flops_per_token=partial(batch_flops, flop_model),
                      strategy=build_strategy(t, ctx), loader=loader)
    if t.resume_from_checkpoint:
        trainer.resume(t.resume_from_checkpoint)
    try:
        result = trainer.run()
    finally:
        if metrics is not None:
            metrics.close()
            if t.plot_loss:
                plot_loss(out / METRICS_FILE, out / LOSS_PLOT_FILE)
    if result.stopped:  # graceful stop: the checkpoint is the output; resume to finish
        barrier(ctx)
        return {"stopped": True, "steps": result.state.step, "checkpoint": str(result.checkpoint)}
    gathered = trainer.strategy.export_state(adapter=lora)  # collective when sharded
    summary: dict[str, Any] = {}
    if ctx.is_main:
        save_artifacts(out, state_dict=gathered)
        summary = write_summary(out, cfg, result, data.report, device)
    barrier(ctx)
    return summary


def build_model(cfg: Config, model_path: str, device: torch.device) -> torch.nn.Module:
    """The base model on `device` with its trainable parameters set up."""
    m, t = cfg.model, cfg.training
    torch.manual_seed(t.seed)
    model = load_causal_lm(model_path, dtype=_base_dtype(cfg, device),
                           trust_remote_code=m.trust_remote_code,
                           attn_implementation=m.attn_implementation, device=device)
    model = prepare_trainable(model, cfg.finetuning, m.adapter_name_or_path)
    apply_speed_settings(model, cfg)
    return model


def apply_speed_settings(model: torch.nn.Module, cfg: Config) -> None:
    """Attention kernel, fused modules, activation checkpointing and compilation."""
    m, t = cfg.model, cfg.training
    if m.attn_implementation == "varlen":
        use_varlen_attention(model)
    if m.enable_liger_kernel:
        if liger_ops() is None:
            raise ConfigError("enable_liger_kernel: liger-kernel is not installed; pip install "
                              "liger-kernel, or set enable_liger_kernel: false")
        apply_fused_kernels(model, use_liger=True)
    enable_checkpointing(model, t.gradient_checkpointing)
    model.config.use_cache = False
    if m.torch_compile:
        compile_decoder_layers(model)


def _base_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    if device.type != "cuda":
        return torch.float32
    frozen_base = cfg.finetuning.finetuning_type != "full"
    if frozen_base and cfg.training.bf16:
        return torch.bfloat16
    if frozen_base and cfg.training.fp16:
        return torch.float16
    return torch.float32


def _save_model(folder: Path, *, model: torch.nn.Module, tokenizer: Any, template_source: str,
                cfg: Config, state_dict: dict[str, torch.Tensor] | None = None,
                save_extra: Any = None) -> None:
    """The adapter (PEFT format) or full model (safetensors), and the tokenizer carrying the
    chat template the model was trained with. `state_dict`: tensors gathered from a sharded
    model (FSDP2, ZeRO-3); None saves the live model's own."""
    folder.mkdir(parents=True, exist_ok=True)
    if state_dict is None:
        model.save_pretrained(str(folder))
    else:
        model.save_pretrained(str(folder), state_dict=state_dict)
    tokenizer.chat_template = template_source
    tokenizer.save_pretrained(str(folder))
    info = {"tunesmith_version": __version__,
            "model_name_or_path": cfg.model.model_name_or_path,
            "template": cfg.model.template or "tokenizer",
            "finetuning_type": cfg.finetuning.finetuning_type,
            "dataset": cfg.data.dataset}
    (folder / "tunesmith.json").write_text(json.dumps(info, indent=2))
    if save_extra is not None:  # e.g. a reward model's value head
        save_extra(folder)
