"""Checks on a row beyond its format: text that cannot be encoded, empty answers.
(Media rows are checked where they are loaded: data/pipeline.py and data/media.py.)

Each returns the reason a row cannot be trained on, or None; the pipeline reports the
reason with the row's file:line like every other bad row.
"""

from __future__ import annotations

import re

from tunesmith.data.conversation import Conversation

_SURROGATE = re.compile("[\ud800-\udfff]")


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
