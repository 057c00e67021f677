"""LLaMA-Factory keys that tunesmith knows but does not support yet.

A YAML using one of them fails with a message saying so, instead of the key being
dropped silently. Keys move from here into the schema as they are implemented.
"""

from __future__ import annotations

LLAMA_FACTORY_KEYS_NOT_YET_SUPPORTED: frozenset[str] = frozenset("""
adapter_folder split_special_tokens moe_aux_loss_coef train_from_scratch offload_folder
use_cache infer_dtype quantization_device_map block_diag_attn eval_num_beams
ignore_pad_token_for_loss data_shared_file_system compute_accuracy
include_effective_tokens_per_second
ref_model_quantization_bit prediction_loss_only eval_accumulation_steps
generation_max_length generation_num_beams label_names
length_penalty max_length num_beams remove_unused_columns skip_special_tokens
torch_compile_mode
""".split())
