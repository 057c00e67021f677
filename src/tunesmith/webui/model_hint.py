"""The template proposed for a chosen model: its tokenizer's own chat template when it has
one (exactly what the model was tuned with), else the built-in template listed for its
architecture (config.json's model_type), else none."""

from __future__ import annotations

import json
from pathlib import Path

from tunesmith.data.template import builtin_template_names

# config.json model_type -> built-in template for models whose tokenizer has no chat template
MODEL_TYPE_TEMPLATES: dict[str, str] = {
    "qwen2": "qwen", "qwen2_moe": "qwen", "qwen3": "qwen3", "qwen3_moe": "qwen3",
    "llama": "llama3", "mistral": "mistral", "gemma": "gemma", "gemma2": "gemma",
    "gemma3": "gemma", "phi3": "phi", "glm4": "glm4", "deepseek_v3": "deepseek3",
    "yi": "yi",
}


def propose_template(model_dir: Path) -> tuple[str, str]:
    """(template value for the form, why) for a local model folder."""
    tok = _read_json(model_dir / "tokenizer_config.json")
    if tok.get("chat_template") or (model_dir / "chat_template.jinja").is_file():
        return "", "own"
    model_type = str(_read_json(model_dir / "config.json").get("model_type", ""))
    name = MODEL_TYPE_TEMPLATES.get(model_type, "")
    if name and name in builtin_template_names():
        return name, "model_type"
    return "", "none"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
