"""Which parts of a vision-language model train: the vision tower, the projector and the
language model, each frozen or not (LLaMA-Factory's freeze_vision_tower,
freeze_multi_modal_projector, freeze_language_model), and LoRA targets inside the
unfrozen parts only (by default: the language model's linear layers)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tunesmith.config.multimodal import MultimodalConfig
from tunesmith.errors import ConfigError

# Parameter-name prefixes of each part, after the `model.` of transformers' Qwen-VL classes
PROJECTOR = ("visual.merger", "visual.deepstack_merger_list")
TOWER = ("visual",)
LANGUAGE = ("language_model", "lm_head")


@dataclass(frozen=True)
class VisionParts:
    """The frozen parts as config flags, applied to parameter names."""

    tower: bool
    projector: bool
    language: bool

    @classmethod
    def from_config(cls, mm: MultimodalConfig) -> VisionParts:
        return cls(mm.freeze_vision_tower, mm.freeze_multi_modal_projector,
                   mm.freeze_language_model)

    def part_of(self, name: str) -> str:
        """'projector', 'tower' or 'language' for a parameter or module name."""
        inner = name.split("base_model.model.", 1)[-1]
        inner = inner[len("model."):] if inner.startswith("model.") else inner
        if inner.startswith(PROJECTOR):
            return "projector"
        if inner.startswith(TOWER):
            return "tower"
        return "language"

    def frozen(self, name: str) -> bool:
        return {"tower": self.tower, "projector": self.projector,
                "language": self.language}[self.part_of(name)]


def lora_targets(model: torch.nn.Module, parts: VisionParts, short_names: list[str]
                 ) -> list[str]:
    """Full names of the linear layers LoRA wraps: those of the unfrozen parts whose short
    name is asked for (`short_names` empty or ['all']: every one), the output head excluded."""
    head = model.get_output_embeddings()
    every = short_names in ([], ["all"])
    names = [n for n, m in model.named_modules()
             if isinstance(m, torch.nn.Linear) and m is not head and not parts.frozen(n)
             and (every or n.rsplit(".", 1)[-1] in short_names)]
    if not names:
        raise ConfigError(f"lora_target: {short_names} matches no linear layer of the unfrozen "
                          "parts (freeze_vision_tower / freeze_multi_modal_projector / "
                          "freeze_language_model)")
    return names


def freeze_parts(model: torch.nn.Module, parts: VisionParts) -> None:
    """Turn off gradients of the frozen parts' own weights (LoRA weights stay trainable)."""
    for name, p in model.named_parameters():
        if parts.frozen(name) and "lora_" not in name:
            p.requires_grad_(False)
    if not any(p.requires_grad for p in model.parameters()):
        raise ConfigError("freeze_vision_tower, freeze_multi_modal_projector and "
                          "freeze_language_model leave nothing to train; unfreeze one part")
