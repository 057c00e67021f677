"""`tunesmith train`: config -> data -> model (+adapters) -> loop -> outputs.

Read top to bottom; every step is a call into a lower layer.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch

from tunesmith import __version__
from tunesmith.adapters.setup import prepare_trainable
from tunesmith.adapters.variants import save_pissa_converted, save_pissa_init
from tunesmith.adapters.vision import VisionParts
from tunesmith.config.environment import cache_root, distributed_env
from tunesmith.config.loader import dump_config
from tunesmith.config.schema import Config
from tunesmith.data.eval_groups import eval_groups
from tunesmith.data.loader import LoaderOptions
from tunesmith.data.loading import DataContext, apply_packing, prepare_data
from tunesmith.data.slot_renderer import check_added_tokens, make_renderer
from tunesmith.data.template import load_template_source
from tunesmith.distributed.context import (
    DistContext,
    barrier,
    broadcast_object,
    init_distributed,
    several_ranks,
)
from tunesmith.distributed.deepspeed import leave_single_rank_group
from tunesmith.distributed.handoff import prepare_on_main
from tunesmith.distributed.strategy import build_strategy, fsdp_settings
from tunesmith.errors import ConfigError, TunesmithError
from tunesmith.kernels.fused import liger_ops
from tunesmith.kernels.linear_ce import use_compiled_loss
from tunesmith.models.acceleration import (
    apply_fused_kernels,
    apply_fused_lora_mlp,
    compile_decoder_layers,
    enable_checkpointing,
    is_vision_language,
    keep_lora_inputs_in_compute_dtype,
    set_attention,
    set_tf32,
    upcast_norm_weights,
)
from tunesmith.models.compile_cache import (
    CompileCache,
    compile_settings,
    open_compile_cache,
    save_compile_cache,
)
from tunesmith.models.flops import batch_flops, build_flop_model
from tunesmith.models.fp8 import convert_to_fp8
from tunesmith.models.host_embedding import embedding_to_host
from tunesmith.models.loader import load_causal_lm, load_tokenizer
from tunesmith.models.neftune import add_neftune
from tunesmith.models.processor import (
    is_vision_model,
    load_vision_settings,
    save_processor_files,
)
from tunesmith.models.provision import resolve_model_path
from tunesmith.models.speed import (
    CompileGuard,
    SpeedPlan,
    check_compile_backend,
    plan_attention,
    plan_compile,
)
from tunesmith.recipes.stage import StageBuilder, StageParts
from tunesmith.runs.folder import (
    LOCK_FILE,
    LOSS_PLOT_FILE,
    METRICS_FILE,
    OUTPUT_ARTIFACTS,
    list_checkpoints,
    lock_run_folder,
)
from tunesmith.train.launcher_env import apply_launcher_env
from tunesmith.train.loop import Trainer
from tunesmith.train.metrics import MetricsLog, plot_loss
from tunesmith.train.run_setup import (
    amp_dtype,
    build_objective,
    check_run_keys,
    check_wrap_class,
    extend_vocab,
    grow_embeddings,
    load_options,
    log_param_status,
    master_dtype,
)
from tunesmith.train.summary import reset_lever_counts, speed_report, write_summary

log = logging.getLogger(__name__)

def check_output_dir(cfg: Config) -> Path:
    t = cfg.training
    if not t.output_dir:
        raise ConfigError("output_dir: not set; give a folder for the tuned model, e.g. "
                          "output_dir: saves/my-run")
    out = Path(t.output_dir)
    if out.exists() and any(p.name != LOCK_FILE for p in out.iterdir()):
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
    """Stages sft and pt: next-token cross-entropy (with the configured loss variant)."""
    return StageParts(build_objective(cfg, model))


def run_sft(cfg: Config, build_stage: StageBuilder = sft_stage) -> dict[str, Any]:
    """Train any stage (`build_stage` gives its objective: sft_stage, preference_stage)
    under output_dir's lock, taken by the main process before anything is written there, so
    a second run into the same folder is refused and the first stays untouched."""
    lock = (lock_run_folder(Path(cfg.training.output_dir), "tunesmith train")
            if distributed_env()["rank"] == 0 and cfg.training.output_dir else None)
    try:
        return _run_sft(cfg, build_stage)
    finally:
        leave_single_rank_group()  # DeepSpeed in one process: its LOCAL_RANK ends here
        if lock is not None:
            lock.release()


def _run_sft(cfg: Config, build_stage: StageBuilder) -> dict[str, Any]:
    m, f, t = cfg.model, cfg.finetuning, cfg.training
    if not m.model_name_or_path:
        raise ConfigError("model_name_or_path: not set; e.g. smollm2-135m-instruct")
    check_run_keys(cfg)
    apply_launcher_env(cfg)  # deepspeed's --local_rank, accelerate's FSDP settings
    started = time.perf_counter()
    graphs_before = reset_lever_counts()
    offload = bool(t.fsdp) and fsdp_settings(t).cpu_offload
    ctx = init_distributed(t.device, t.ddp_backend, t.ddp_timeout, cpu_offload=offload)
    out = check_output_dir_once(cfg, ctx)
    device = ctx.device
    model_path = resolve_model_path(m.model_name_or_path, m.cache_dir or None)
    tokenizer = load_tokenizer(model_path, trust_remote_code=m.trust_remote_code,
                               opts=load_options(cfg))
    described = extend_vocab(tokenizer, cfg)  # add_tokens etc., before tokenising the data
    template_name, template_source = load_template_source(m.template, tokenizer)
    vision = load_vision_settings(model_path, tokenizer, cfg)  # None: a text-only model
    renderer = make_renderer(template_name, template_source, tokenizer, cfg.template,
                             media=vision is not None)
    data = prepare_on_main(
        lambda: prepare_data(cfg.data, DataContext(renderer, tokenizer, t.seed, f.stage,
                                                   t.overwrite_cache, vision,
                                                   m.model_name_or_path)),
        out / ".cache", "prepared-data", ctx, t.ddp_timeout)
    if ctx.is_main:
        dump_config(cfg, out / "config.resolved.yaml")

    model, plan = build_model(cfg, model_path, device,  # same seed on every rank: same init
                              vocab=(tokenizer, described))
    check_added_tokens(renderer, model.get_input_embeddings().num_embeddings)
    stage = build_stage(cfg, model, device, tokenizer.pad_token_id)
    if stage.prepare is not None:
        stage.prepare(data)
    train_items = apply_packing(data, cfg.data)
    flop_model = build_flop_model(model, full=f.finetuning_type == "full")
    save_artifacts = partial(_save_model, model=model, tokenizer=tokenizer,
                             template_source=template_source, cfg=cfg,
                             save_extra=stage.save_extra)
    metrics = (MetricsLog(out / METRICS_FILE, t.report_to, out, cfg.run.logging_dir,
                          cfg.run.run_name) if ctx.is_main else None)
    lora = f.finetuning_type in ("lora", "oft")  # an adapter is the output
    trainer = Trainer(model, stage.objective, train_items, data.val, t,
                      pad_id=tokenizer.pad_token_id, device=device, output_dir=out,
                      metrics=metrics, checkpoint_extra=save_artifacts if lora else None,
                      flops_per_token=partial(batch_flops, flop_model),
                      strategy=build_strategy(t, ctx, cfg.run.ddp_find_unused_parameters),
                      loader=_loader_options(cfg.data, plan.padding_free), optim=cfg.optim,
                      run=cfg.run)
    trainer.compile_guard = CompileGuard(model, plan)
    trainer.eval_groups = eval_groups(data.val, cfg.data)
    cache = _open_compile_cache(cfg, model, plan)
    if cfg.method.pissa_convert and ctx.is_main and not t.resume_from_checkpoint:
        save_pissa_init(model, out)
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
    if cache is not None and not plan.stats.compile_fallback:
        save_compile_cache(cache)
    gathered = trainer.strategy.export_state(adapter=lora)  # collective when sharded
    summary: dict[str, Any] = {}
    if ctx.is_main:
        save_artifacts(out, state_dict=gathered)
        if cfg.method.pissa_convert:
            save_pissa_converted(model, out)
        summary = write_summary(out, cfg, result, data.report, device,
                                speed=_run_speed(plan, trainer, cache, started, graphs_before))
    barrier(ctx)
    return summary


def _run_speed(plan: SpeedPlan, trainer: Trainer, cache: CompileCache | None, started: float,
               graphs_before: int) -> dict[str, Any]:
    """run_summary.speed: the plan as resolved, with what ran."""
    speed = speed_report(plan, started, trainer.throughput.first_step_end, graphs_before)
    speed.update(compile_cache=cache.report() if cache is not None else None,
                 lagged_steps=trainer.lagged,  # no host sync per step (train/lagged.py)
                 padding_free_batches=trainer.flattened_batches,
                 zero3_whole_layers=getattr(trainer.strategy, "fetch_units", None))
    return speed


def _loader_options(d: Any, flatten: bool = False) -> LoaderOptions:
    return LoaderOptions(d.batch_tokens, d.dataloader_num_workers, d.dataloader_pin_memory,
                         d.dataloader_prefetch_factor, d.dataloader_persistent_workers,
                         flatten)


def build_model(cfg: Config, model_path: str, device: torch.device,
                vocab: tuple[Any, dict[str, str]] | None = None
                ) -> tuple[torch.nn.Module, SpeedPlan]:
    """The base model on `device` with its trainable parameters and speed levers set up;
    `vocab`: the tokenizer (with added tokens) and token descriptions the embeddings must
    follow."""
    m, t = cfg.model, cfg.training
    torch.manual_seed(t.seed)
    vision = is_vision_model(model_path)
    plan = plan_attention(cfg, device, vision)  # before loading: transformers checks it
    model = load_causal_lm(model_path, dtype=_base_dtype(cfg, device),
                           trust_remote_code=m.trust_remote_code,
                           attn_implementation=plan.attention, device=device,
                           opts=load_options(cfg))
    check_wrap_class(model, cfg)
    method = grow_embeddings(model, vocab[0], cfg, vocab[1]) if vocab else cfg.method
    parts = VisionParts.from_config(cfg.multimodal) if vision else None
    model = prepare_trainable(model, cfg.finetuning, m.adapter_name_or_path, method,
                              master_dtype(cfg, device), parts)
    if cfg.method.fp8:
        convert_to_fp8(model, device, cfg.method.fp8_enable_fsdp_float8_all_gather)
    plan_compile(plan, cfg, device, getattr(model.config, "model_type", ""))
    apply_speed_settings(model, cfg, plan)
    if cfg.run.neftune_noise_alpha:
        add_neftune(model, cfg.run.neftune_noise_alpha)
    if cfg.run.print_param_status:
        log_param_status(model)
    return model, plan


def apply_speed_settings(model: torch.nn.Module, cfg: Config,
                         plan: SpeedPlan | None = None) -> SpeedPlan:
    """Attention kernel, tf32, norm upcast, fused modules, activation checkpointing and
    compilation. Without a `plan` (benchmark harness) it is made from the config."""
    device = next(model.parameters()).device
    if plan is None:
        plan = plan_attention(cfg, device)
        plan_compile(plan, cfg, device, getattr(model.config, "model_type", ""))
    set_attention(model, plan.attention)
    set_tf32(plan.tf32, device)
    if plan.upcast_layernorm:
        plan.stats.upcast_params = upcast_norm_weights(model)
        log.info("upcast_layernorm: %d norm weight(s) cast to fp32", plan.stats.upcast_params)
    if cfg.model.enable_liger_kernel:
        if liger_ops() is None:
            raise ConfigError("enable_liger_kernel: liger-kernel is not installed; pip install "
                              "liger-kernel, or set enable_liger_kernel: false")
        apply_fused_kernels(model, use_liger=True)
    sharded_by = "DeepSpeed" if cfg.training.deepspeed else "FSDP" if cfg.training.fsdp else ""
    plan.stats.fused_lora_mlps, plan.stats.fused_lora_mlp_reason = apply_fused_lora_mlp(
        model, cfg.speed.fused_lora_mlp, cfg.finetuning.finetuning_type, sharded_by,
        plan.checkpointing)
    if device.type == "cuda" and not cfg.training.deepspeed and \
            amp_dtype(cfg.training, device) is not None:  # the trainer autocasts every pass
        plan.stats.lora_inputs_uncast = keep_lora_inputs_in_compute_dtype(model)
    plan.host_embedding, plan.stats.input_embedding = embedding_to_host(
        model, plan.checkpointing, sharded=bool(sharded_by) or several_ranks(),
        vision=is_vision_language(model))
    plan.stats.checkpointed_layers = enable_checkpointing(
        model, plan.checkpointing, reentrant=plan.reentrant, stats=plan.stats)
    model.config.use_cache = False
    if plan.compile:
        check_compile_backend(plan.compile_backend)
        plan.stats.compiled_layers = compile_decoder_layers(  # ZeRO-3 hooks each layer
            model, plan.compile_backend, hooks_outside=bool(cfg.training.deepspeed))
    use_compiled_loss(plan.compile and device.type == "cuda"
                      and plan.compile_backend == "inductor")
    return plan


def _open_compile_cache(cfg: Config, model: torch.nn.Module, plan: SpeedPlan
                        ) -> CompileCache | None:
    if not plan.compile:
        return None
    root = Path(cfg.model.cache_dir).expanduser() if cfg.model.cache_dir else cache_root()
    shape = (cfg.training.per_device_train_batch_size, cfg.data.cutoff_len)
    return open_compile_cache(root, compile_settings(model, plan, shape))


def _base_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    if device.type != "cuda":
        return torch.float32
    if cfg.method.pure_bf16:
        return torch.bfloat16
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
    save_processor_files(resolve_model_path(cfg.model.model_name_or_path,
                                            cfg.model.cache_dir or None), folder)
    info = {"tunesmith_version": __version__,
            "model_name_or_path": cfg.model.model_name_or_path,
            "template": cfg.model.template or "tokenizer",
            "finetuning_type": cfg.finetuning.finetuning_type,
            "dataset": cfg.data.dataset}
    (folder / "tunesmith.json").write_text(json.dumps(info, indent=2))
    if save_extra is not None:  # e.g. a reward model's value head
        save_extra(folder)
