"""What a saved adapter folder carries besides its weights."""

from __future__ import annotations

import json
from pathlib import Path


def saved_chat_template(adapters: list[str]) -> str | None:
    """The chat template saved with the last adapter that has one (the one it trained with):
    `chat_template.jinja`, or the `chat_template` of its tokenizer_config.json."""
    for path in reversed(adapters):
        folder = Path(path)
        if (folder / "chat_template.jinja").is_file():
            return (folder / "chat_template.jinja").read_text(encoding="utf-8")
        tok_cfg = folder / "tokenizer_config.json"
        if tok_cfg.is_file():
            value = json.loads(tok_cfg.read_text(encoding="utf-8")).get("chat_template")
            if isinstance(value, str):
                return value
    return None
