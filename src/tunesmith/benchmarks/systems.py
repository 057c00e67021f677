"""The systems compared: tunesmith's training step, and the peers' (transformers + PEFT,
with or without liger-kernel), each set up on the same base model and undone afterwards."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tunesmith.data.batching import Batch

LORA_TARGETS = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"


@dataclass
class System:
    step: Callable[[Batch], Any]  # one optimizer step: the loss (host float), or with
    # tunesmith's lagged steps a PendingStep (read later, as `tunesmith train` does)
    teardown: Callable[[], None]
    model: torch.nn.Module


def tunesmith_system(base: torch.nn.Module, *, lora: bool, checkpointing: str, compile: bool,
                     varlen: bool, workdir: Path, lr: float = 1e-4,
                     extra: dict[str, Any] | None = None, lagged: bool = False) -> System:
    """tunesmith's own path: prepare_trainable + apply_speed_settings + Trainer.train_step."""
    from tunesmith.adapters.setup import prepare_trainable
    from tunesmith.config import load_config
    from tunesmith.data.encode import EncodedSample
    from tunesmith.recipes.sft import apply_speed_settings
    from tunesmith.train.loop import Trainer
    from tunesmith.train.metrics import MetricsLog
    from tunesmith.train.objective import NextTokenObjective

    cfg = load_config(overrides={
        "model_name_or_path": "bench", "bf16": True, "device": str(base.device), "learning_rate": lr,
        "lr_scheduler_type": "constant", "finetuning_type": "lora" if lora else "full",
        "lora_rank": 16, "lora_alpha": 32, "lora_target": LORA_TARGETS,
        "gradient_checkpointing": checkpointing, "torch_compile": compile,
        "attn_implementation": "varlen" if varlen else "sdpa", "max_steps": 10**6,
        **(extra or {})})
    torch.manual_seed(1)
    model = prepare_trainable(base, cfg.finetuning, [])
    apply_speed_settings(model, cfg)
    workdir.mkdir(parents=True, exist_ok=True)
    dummy = [EncodedSample(torch.zeros(2, dtype=torch.int32).numpy(),
                           torch.zeros(2, dtype=torch.int32).numpy())]
    trainer = Trainer(model, NextTokenObjective("chunked", cfg.training.loss_chunk_size), dummy, [], cfg.training,
                      pad_id=0, device=next(base.parameters()).device, output_dir=workdir,
                      metrics=MetricsLog(workdir / "metrics.jsonl"))

    def step(batch: Batch) -> Any:
        if lagged and trainer.lagged:
            return trainer.train_step([batch], lagged=True)
        return trainer.train_step([batch])[0]

    def teardown() -> None:
        _undo_speed_settings(base)
        if lora:
            model.unload()

    return System(step, teardown, model)


def _undo_speed_settings(base: torch.nn.Module) -> None:
    from tunesmith.kernels.fused import restore_mlps
    from tunesmith.models.host_embedding import embedding_to_device

    restore_mlps(base)
    embedding_to_device(base)  # offload parked the frozen table in host memory  # the peers run on the model's own modules (liger patches those)
    for layer in base.get_decoder().layers:
        layer._compiled_call_impl = None
    if getattr(base, "is_gradient_checkpointing", False):
        base.gradient_checkpointing_disable()
    base.set_attn_implementation("sdpa")


def peer_system(base: torch.nn.Module, *, lora: bool, checkpointing: bool, liger: bool,
                lr: float = 1e-4) -> System:
    """What LLaMA-Factory runs: HF model forward with labels (full logits unless Liger's fused
    linear cross-entropy is applied), PEFT LoRA with fp32 adapter weights, bf16 autocast,
    AdamW, gradient clipping at 1.0."""
    if liger:
        from liger_kernel.transformers import apply_liger_kernel_to_qwen2

        apply_liger_kernel_to_qwen2(model=base)  # patches transformers' qwen2 module globally
    model = base
    if lora:
        from peft import LoraConfig, get_peft_model

        torch.manual_seed(1)
        model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0,
                                                target_modules=LORA_TARGETS.split(","),
                                                task_type="CAUSAL_LM"))
    params = [p for p in model.parameters() if p.requires_grad]
    for p in params:
        p.data = p.data.float()
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if lora:
            model.enable_input_require_grads()
    cuda = params[0].is_cuda
    opt = torch.optim.AdamW(params, lr=lr, fused=cuda or None)

    device = params[0].device

    def step(batch: Batch) -> float:
        batch = batch.to(device)
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=cuda):
            out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                        labels=labels, use_cache=False)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return out.loss.detach()

    def teardown() -> None:
        if checkpointing:
            base.gradient_checkpointing_disable()
        if lora:
            model.unload()

    return System(step, teardown, model)


def describe_environment() -> dict[str, Any]:
    import platform

    import transformers

    info = {"torch": torch.__version__, "transformers": transformers.__version__,
            "python": platform.python_version()}
    try:
        import peft

        info["peft"] = peft.__version__
    except ImportError:
        pass
    try:
        import importlib.metadata as md

        info["liger_kernel"] = md.version("liger-kernel")
    except Exception:  # noqa: BLE001 - optional
        info["liger_kernel"] = "not installed"
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["gpu_count"] = torch.cuda.device_count()
    return info
