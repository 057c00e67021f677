"""LLaMA-Factory keys that tunesmith refuses on purpose, each with the reason.

These are not "not yet" (config/unsupported.py lists those): they name hardware,
engines or patches this project does not run (Ascend NPU kernels, KTransformers,
Megatron, class-level model patches, hub uploads). A YAML using one fails with the
reason and what to do instead.
"""

from __future__ import annotations

_KT = ("KTransformers is a separate CPU/GPU hybrid MoE engine that tunesmith does not "
       "embed; train the model with LoRA here, or use LLaMA-Factory for KTransformers runs")
_MCA = ("Megatron-Core training (mcore_adapter) is a separate engine; tunesmith trains with "
        "DDP, FSDP2 or DeepSpeed (fsdp:, deepspeed: keys)")
_HUB = ("tunesmith is offline-first and never uploads; push the saved output_dir yourself "
        "(huggingface-cli upload)")
_TOKEN = ("tokens are never read from a YAML (it ends up in config.resolved.yaml); set the "
          "HF_TOKEN environment variable instead")
_PROFILER = ("the torch profiler hooks are not wired into the loop; profile with "
             "`tunesmith bench` or torch.profiler around `tunesmith.train`")
_SWANLAB = "SwanLab logging is not available; use report_to: tensorboard or wandb"
_ENGINE = ("engine tuning keys are not passed on: `tunesmith api --infer_backend vllm|sglang` "
           "starts that engine with tunesmith's flags (--max_model_len, --port, ...); for "
           "other settings run the engine yourself on the exported model")
_RAY = ("Ray's run records on cloud storage (s3, gs) are not supported; leave it unset and "
        "give ray_storage_path a local or mounted folder")

REFUSED_KEYS: dict[str, str] = {
    "use_kt": _KT, "kt_weight_path": _KT, "kt_expert_checkpoint_path": _KT,
    "kt_use_lora_experts": _KT, "kt_lora_expert_num": _KT,
    "kt_lora_expert_intermediate_size": _KT, "kt_optimize_rule": _KT, "cpu_infer": _KT,
    "chunk_size": _KT, "mode": _KT, "kt_maxlen": _KT, "kt_use_cuda_graph": _KT,
    "kt_mode": _KT, "kt_force_think": _KT,
    "use_mca": _MCA, "use_hyper_parallel": _MCA, "hyper_parallel_args": _MCA,
    "use_v1_kernels": ("LLaMA-Factory's v1 kernel plugins patch model classes (Ascend NPU "
                       "fused ops among them); tunesmith swaps modules per instance instead: "
                       "enable_liger_kernel, attn_implementation: varlen"),
    "mixture_of_depths": ("Mixture-of-Depths converts the model through the MoD package, which "
                          "replaces the model's classes; tunesmith never patches transformers "
                          "classes. Train the dense model instead"),
    "shift_attn": ("LongLoRA's shift short attention replaces Llama's attention class; use "
                   "rope_scaling with model_max_length for long contexts instead"),
    "use_unsloth": ("Unsloth patches transformers' classes; tunesmith's own fused loss, varlen "
                    "attention and liger kernels cover the same speed-ups: remove the key"),
    "use_unsloth_gc": ("Unsloth's gradient checkpointing patches transformers; use "
                       "gradient_checkpointing: offload (activations parked in CPU memory)"),
    "push_to_hub": _HUB, "hub_model_id": _HUB, "hub_token": _TOKEN, "hub_strategy": _HUB,
    "hub_private_repo": _HUB, "export_hub_model_id": _HUB,
    "hf_hub_token": _TOKEN, "ms_hub_token": _TOKEN, "om_hub_token": _TOKEN,
    "enable_torch_profiler": _PROFILER, "profiler_output_dir": _PROFILER,
    "profiler_wait_steps": _PROFILER, "profiler_warmup_steps": _PROFILER,
    "profiler_active_steps": _PROFILER, "profiler_repeat": _PROFILER,
    "profiler_record_shapes": _PROFILER, "profiler_profile_memory": _PROFILER,
    "profiler_with_stack": _PROFILER, "profile_modules": _PROFILER,
    "use_swanlab": _SWANLAB, "swanlab_project": _SWANLAB, "swanlab_workspace": _SWANLAB,
    "swanlab_run_name": _SWANLAB, "swanlab_mode": _SWANLAB, "swanlab_api_key": _SWANLAB,
    "swanlab_logdir": _SWANLAB, "swanlab_lark_webhook_url": _SWANLAB,
    "swanlab_lark_secret": _SWANLAB,
    "compute_dtype": ("LLaMA-Factory derives it from bf16 / fp16 and does not accept it in a "
                      "YAML either; set bf16: true or fp16: true"),
    "device_map": ("LLaMA-Factory sets it itself and does not accept it in a YAML either; "
                   "choose the device with device: (auto, cpu, cuda:N), several GPUs with "
                   "torchrun"),
    "new_special_tokens": ("renamed in LLaMA-Factory 0.9.4: use add_special_tokens (or "
                           "new_special_tokens_config for tokens with descriptions)"),
    "vllm_maxlen": _ENGINE, "vllm_gpu_util": _ENGINE, "vllm_enforce_eager": _ENGINE,
    "vllm_max_lora_rank": _ENGINE, "vllm_config": _ENGINE, "sglang_maxlen": _ENGINE,
    "sglang_mem_fraction": _ENGINE, "sglang_tp_size": _ENGINE, "sglang_config": _ENGINE,
    "sglang_lora_backend": _ENGINE,
    "ray_storage_filesystem": _RAY,
}


def refused_message(key: str, where: str) -> str:
    """The error for a refused key: what, where from, why, and what to do instead."""
    return (f"{key}: this LLaMA-Factory key is refused by tunesmith (from {where}): "
            f"{REFUSED_KEYS[key]}")
