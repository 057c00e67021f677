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
from tunesmith.errors import ConfigError
from tunesmith.kernels.fused import liger_ops
from tunesmith.models.acceleration import (
    apply_fused_kernels,
    compile_decoder_layers,
    enable_checkpointing,
    use_varlen_attention,
)
from tunesmith.models.flops import batch_flops, build_flop_model
from tunesmith.models.loader import load_causal_lm, load_tokenizer, pick_device
from tunesmith.models.provision import resolve_model_path
from tunesmith.train.checkpoint import list_checkpoints
from tunesmith.train.loop import Trainer
from tunesmith.train.metrics import MetricsLog, plot_loss
from tunesmith.train.summary import write_summary

log = logging.getLogger(__name__)

OUTPUT_ARTIFACTS = ("metrics.jsonl", "loss.png", "run_summary.json", "config.resolved.yaml")


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


def run_sft(cfg: Config) -> dict[str, Any]:
    out = check_output_dir(cfg)
    m, f, t = cfg.model, cfg.finetuning, cfg.training
    if not m.model_name_or_path:
        raise ConfigError("model_name_or_path: not set; e.g. smollm2-135m-instruct")
    device = pick_device(t.device)
    model_path = resolve_model_path(m.model_name_or_path, m.cache_dir or None)
    tokenizer = load_tokenizer(model_path, trust_remote_code=m.trust_remote_code)
    template_name, template_source = load_template_source(m.template, tokenizer)
    renderer = ChatRenderer(template_name, template_source, tokenizer)
    data = prepare_data(cfg.data, DataContext(renderer, tokenizer, t.seed, f.stage,
                                              t.overwrite_cache))
    train_items = apply_packing(data, cfg.data)
    dump_config(cfg, out / "config.resolved.yaml")

    torch.manual_seed(t.seed)
    dtype = _base_dtype(cfg, device)
    model = load_causal_lm(model_path, dtype=dtype, trust_remote_code=m.trust_remote_code,
                           attn_implementation=m.attn_implementation, device=device)
    model = prepare_trainable(model, f, m.adapter_name_or_path)
    apply_speed_settings(model, cfg)

    from tunesmith.train.objective import NextTokenObjective

    flop_model = build_flop_model(model, full=f.finetuning_type == "full")
    save_artifacts = partial(_save_model, model=model, tokenizer=tokenizer,
                             template_source=template_source, cfg=cfg)
    metrics = MetricsLog(out / "metrics.jsonl", t.report_to, out)
    d = cfg.data
    loader = LoaderOptions(d.batch_tokens, d.dataloader_num_workers, d.dataloader_pin_memory,
                           d.dataloader_prefetch_factor, d.dataloader_persistent_workers)
    trainer = Trainer(model, NextTokenObjective(t.loss_impl, t.loss_chunk_size), train_items,
                      data.val, t, pad_id=tokenizer.pad_token_id, device=device,
                      output_dir=out, metrics=metrics,
                      checkpoint_extra=save_artifacts if f.finetuning_type == "lora" else None,
                      flops_per_token=partial(batch_flops, flop_model), loader=loader)
    if t.resume_from_checkpoint:
        trainer.resume(t.resume_from_checkpoint)
    try:
        result = trainer.run()
    finally:
        metrics.close()
        if t.plot_loss:
            plot_loss(out / "metrics.jsonl", out / "loss.png")
    _save_model(out, model=model, tokenizer=tokenizer, template_source=template_source, cfg=cfg)
    return write_summary(out, cfg, result, data.report, device)


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
                cfg: Config) -> None:
    """The adapter (PEFT format) or full model (safetensors), and the tokenizer carrying the
    chat template the model was trained with."""
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    tokenizer.chat_template = template_source
    tokenizer.save_pretrained(str(folder))
    info = {"tunesmith_version": __version__,
            "model_name_or_path": cfg.model.model_name_or_path,
            "template": cfg.model.template or "tokenizer",
            "finetuning_type": cfg.finetuning.finetuning_type,
            "dataset": cfg.data.dataset}
    (folder / "tunesmith.json").write_text(json.dumps(info, indent=2))
