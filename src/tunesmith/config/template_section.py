"""Template keys (LLaMA-Factory's names): they change how a LLaMA-Factory template name
given in `template:` writes conversations."""

from __future__ import annotations

from dataclasses import dataclass

from tunesmith.config.fields import opt

TOOL_FORMATS = ("", "default", "gemma4", "glm4", "glm4_moe", "lfm2", "ling", "llama3",
                "minimax1", "minimax2", "mistral", "qwen", "qwen3_5", "seed_oss")


@dataclass
class TemplateConfig:
    default_system: str = opt(
        "", "System prompt used when a sample has none (empty: the template's own default).")
    tool_format: str = opt(
        "", "How tools and function calls are written (empty: the template's own format).",
        choices=TOOL_FORMATS, advanced=True)
    enable_thinking: bool = opt(
        True, "Reasoning templates: true trains on the thought (an empty one is added to "
        "answers without any); false removes thoughts and puts an empty one in the prompt.")
    preserve_thinking: bool = opt(
        False, "Reasoning templates with mask_history: keep the thoughts of earlier turns.",
        advanced=True)
