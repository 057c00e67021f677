"""Checks on a row beyond its format: text that cannot be encoded, empty answers, media.

Each returns the reason a row cannot be trained on, or None; the pipeline reports the
reason with the row's file:line like every other bad row.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tunesmith.data.conversation import Conversation

_SURROGATE = re.compile("[\ud800-\udfff]")
MEDIA_COLUMNS = ("images", "videos", "audios")


def text_problem(conv: Conversation) -> str | None:
    """Lone surrogates come from bytes that are not UTF-8 (or from \\ud800-style escapes):
    no tokenizer can encode them."""
    for i, m in enumerate(conv.messages):
        if _SURROGATE.search(m.content):
            return (f"message {i} ({m.role}) holds invalid UTF-8 or a lone surrogate escape; "
                    "re-save the file as UTF-8")
    return None


def empty_answer(conv: Conversation) -> str | None:
    """An empty final answer would teach only the end-of-turn token."""
    last = conv.messages[-1] if conv.messages else None
    if (not conv.plain and last is not None and last.role == "assistant"
            and not last.content.strip() and not last.tool_calls):
        return "the answer is empty (it would teach only the end-of-turn token)"
    return None


def media_problem(row: dict[str, Any], where: str) -> str | None:
    """tunesmith trains text-only models: media columns would be dropped with their
    placeholders trained as text, so such rows are refused (naming missing files first)."""
    for column in MEDIA_COLUMNS:
        value = row.get(column)
        if not value:
            continue
        items = value if isinstance(value, list) else [value]
        base = Path(re.sub(r"(:\d+|\[[^\]]*\])$", "", where)).parent
        missing = [str(v) for v in items if isinstance(v, str)
                   and not (Path(v).is_file() or (base / v).is_file())]
        if missing:
            return f"{column}: file {missing[0]!r} not found (looked beside the dataset and in .)"
        return (f"{column}: the row has {len(items)} media item(s), but training is text-only "
                "here: the media would be dropped; remove the column or use a text dataset")
    return None
