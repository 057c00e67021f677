"""Function calling: tool calls found in generated text, returned in OpenAI's shape.

The tools of a request are rendered by the model's chat template (its own tool format), so
the model answers a call the way it was trained to. The answer is then read back in the
formats the built-in templates (and most tokenizer templates) use, tried in this order:

```
<tool_call>{"name": ..., "arguments": {...}}</tool_call>   (ChatML / Qwen / Hermes; one
                                                             block per call, text around
                                                             them stays content)
[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]       (Mistral; the marker may have
                                                             been dropped as a special token)
{"name": ..., "parameters": {...}}                         (Llama 3: the whole answer)
```
A block that is not valid JSON, or lacks a name, is left in the content as the model wrote
it, so nothing the model said is lost.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_MISTRAL = "[TOOL_CALLS]"


def parse_tool_calls(text: str) -> tuple[str, list[dict[str, Any]]]:
    """(content left over, calls as {"name", "arguments"}) of a generated answer."""
    if "<tool_call>" in text:
        calls, kept, last = [], [], 0
        for match in _BLOCK.finditer(text):
            call = _as_call(match.group(1))
            kept.append(text[last:match.start()] if call else text[last:match.end()])
            last = match.end()
            if call:
                calls.append(call)
        kept.append(text[last:])
        return "".join(kept).strip(), calls
    body = text.split(_MISTRAL, 1)[1] if _MISTRAL in text else text
    calls = _json_calls(body.strip())
    if calls:
        head = text.split(_MISTRAL, 1)[0] if _MISTRAL in text else ""
        return head.strip(), calls
    return text, []


def _json_calls(body: str) -> list[dict[str, Any]]:
    """Calls from a JSON object, a JSON list, or JSON objects one per line."""
    if not body or body[0] not in "[{":
        return []
    try:
        value = json.loads(body)
        items = value if isinstance(value, list) else [value]
    except json.JSONDecodeError:
        items = []
        for line in body.splitlines():
            try:
                items.append(json.loads(line))
            except json.JSONDecodeError:
                return []
    calls = [_call_of(x) for x in items]
    return calls if calls and all(calls) else []  # type: ignore[return-value]


def _as_call(raw: str) -> dict[str, Any] | None:
    try:
        return _call_of(json.loads(raw))
    except json.JSONDecodeError:
        return None


def _call_of(value: Any) -> dict[str, Any] | None:
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    return {"name": value["name"], "arguments": args}


def openai_tool_calls(calls: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's `tool_calls` list: arguments as a JSON string, a fresh id per call."""
    return [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c["name"], "arguments": c["arguments"]
                          if isinstance(c["arguments"], str) else json.dumps(
                              c["arguments"], ensure_ascii=False)}} for c in calls]


_MARKERS = ("<tool_call>", _MISTRAL)
_OPENERS = re.compile(r"[<\[]")


class ToolStreamSplitter:
    """Streams one choice's text with tools offered: text that cannot begin a tool call is
    sent at once; from a possible start of a call on (a marker, or JSON opening the answer)
    the text is held until the answer ends, then read for calls."""

    def __init__(self) -> None:
        self.text = ""
        self.sent = 0
        self.held = False  # a call has begun: hold everything to the end

    def add(self, piece: str) -> str:
        """Content that can be shown now."""
        self.text += piece
        if self.held:
            return ""
        if not self.text[:self.sent].strip() and self.text.lstrip()[:1] in ("{", "["):
            self.held = True  # a JSON call as the whole answer (Llama 3 style) may follow
            return self._send(len(self.text) - len(self.text.lstrip()))
        start = self._possible_start()
        if start is not None and any(self.text.startswith(m, start) for m in _MARKERS):
            self.held = True
        return self._send(len(self.text) if start is None else start)

    def finish(self) -> tuple[str, list[dict[str, Any]]]:
        """(remaining content, calls) once the answer is complete."""
        rest = self.text[self.sent:]
        self.sent = len(self.text)
        if not rest:
            return "", []
        content, calls = parse_tool_calls(rest)
        return (content, calls) if calls else (rest, [])

    def _possible_start(self) -> int | None:
        """Earliest index from `sent` where a marker begins or may still begin."""
        for match in _OPENERS.finditer(self.text, self.sent):
            k = match.start()
            tail = self.text[k:]
            if any(m.startswith(tail) or tail.startswith(m) for m in _MARKERS):
                return k
        return None

    def _send(self, upto: int) -> str:
        piece = self.text[self.sent:upto]
        self.sent = max(self.sent, upto)
        return piece
