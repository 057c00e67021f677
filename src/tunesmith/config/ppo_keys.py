"""Keys of stage ppo, named as in LLaMA-Factory (generation uses the eval section's
max_new_tokens, do_sample, temperature, top_p, top_k, repetition_penalty)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from tunesmith.config.fields import opt


@dataclass
class PpoConfig:
    reward_model: str = opt(
        "", "ppo: the reward model. reward_model_type lora: the folder of a `stage: rm` LoRA "
        "adapter (with value_head.safetensors); full: a reward model folder (or base) whose "
        "value head is saved beside it; api: the URL scores are POSTed to.")
    reward_model_adapters: list[str] = opt(
        [], "ppo (reward_model_type full): PEFT adapter folder(s) merged into the reward "
        "model; the value head is read from the last one.")
    reward_model_type: Literal["lora", "full", "api"] = opt(
        "lora", "ppo: lora (the reward adapter on the policy's own base, no second copy), "
        "full (a separate model) or api (an HTTP scoring service).")
    reward_model_quantization_bit: int = opt(
        0, "ppo: quantise the reward model (4 or 8 bits, GPU only); 0: off. Not supported "
        "yet: 0 only.", minimum=0, advanced=True)
    ppo_buffer_size: int = opt(
        1, "ppo: rollouts per PPO step, in units of per_device_train_batch_size x "
        "gradient_accumulation_steps.", minimum=1)
    ppo_epochs: int = opt(4, "ppo: optimisation epochs over each step's rollouts.", minimum=1)
    ppo_score_norm: bool = opt(
        False, "ppo: normalise reward scores by the running mean and standard deviation.")
    ppo_target: float = opt(6.0, "ppo: target KL of the adaptive KL coefficient.", minimum=0,
                            exclusive_min=True)
    ppo_whiten_rewards: bool = opt(
        False, "ppo: whiten the per-token rewards before computing advantages.")
